"""The text decoder inside a Qwen2-Audio checkpoint, seen as a plain Qwen2 causal LM.

A ``Qwen2AudioForConditionalGeneration`` directory is a Qwen2 under ``text_config``, saved
(by every transformers version, 5.x included, which writes the original layout back) with
its tensors under ``language_model.model.*`` and its head as ``language_model.lm_head.*``,
beside the audio tower's ``audio_tower.*`` and ``multi_modal_projector.*``. transformers 5's
in-memory layout (``model.language_model.*``, ``lm_head.*``) is read too, should a tool save
that. As for Idefics3 (``idefics3_text``), this module rewrites the config into the Qwen2's
own ``config.json`` shape and maps the Qwen2's tensor names to where the checkpoint stores
them, so the decoder loads through the ordinary Qwen2 path. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ferrollm.models.config_fields import UnsupportedModelError

#: ``model_type`` of a Qwen2-Audio checkpoint.
QWEN2_AUDIO_MODEL_TYPE = "qwen2_audio"

#: Stored prefix -> the Qwen2's own prefix, for both layouts a checkpoint may use.
_TEXT_PREFIXES = (
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("model.language_model.", "model."),
    ("lm_head.", "lm_head."),
)
#: Text-model types the decoder can be (Qwen2-Audio's is a Qwen2).
_TEXT_MODEL_TYPES = ("qwen2",)
#: Top-level keys of the wrapper that describe the decoder too.
_WRAPPER_KEYS = ("dtype", "torch_dtype")


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The decoder's ``config.json`` dict of a Qwen2-Audio config: ``text_config`` (Qwen2
    when the config leaves its type out, as transformers does) with the wrapper's dtype.

    Raises UnsupportedModelError when ``text_config`` is missing or not a Qwen2."""
    text = config.get("text_config")
    if not isinstance(text, Mapping):
        raise UnsupportedModelError("config.json: `text_config` must be an object")
    model_type = text.get("model_type", "qwen2")
    if model_type not in _TEXT_MODEL_TYPES:
        raise UnsupportedModelError(
            f"config.json: `text_config.model_type` {model_type!r} is not supported; "
            f"supported: {', '.join(_TEXT_MODEL_TYPES)}"
        )
    out = {k: v for k, v in text.items() if k != "architectures"}
    out["model_type"] = model_type
    out["architectures"] = ["Qwen2ForCausalLM"]
    for key in _WRAPPER_KEYS:
        if key in config and key not in out:
            out[key] = config[key]
    return out


def stored_text_names(stored: Mapping[str, str]) -> dict[str, str]:
    """Qwen2 tensor name -> the name a Qwen2-Audio checkpoint stores it under, for the
    decoder's tensors among ``stored``; the audio tower's and projector's are left out."""
    names = {}
    for name in stored:
        for prefix, ours in _TEXT_PREFIXES:
            if name.startswith(prefix):
                names[ours + name.removeprefix(prefix)] = name
                break
    return names
