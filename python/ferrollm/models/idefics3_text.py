"""The text decoder inside an image-text checkpoint, seen as a plain causal LM.

An ``Idefics3ForConditionalGeneration`` (SmolVLM) directory is a Llama under ``text_config``
with its tensors under ``model.text_model.*`` (and ``lm_head.*`` at the top), beside the vision
tower's ``model.vision_model.*`` / ``model.connector.*``. The engine runs that Llama with its
ordinary model class: this module rewrites the config into the Llama's own ``config.json``
shape and maps the Llama's tensor names to where the checkpoint stores them, so the loader
needs one lookup and no family-specific branch. The vision tower is loaded on its own
(``ferrollm.models.vision.load_idefics3_vision``). Torch-free, like the config readers, so
opening a directory (``ferrollm.preflight``) still needs no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ferrollm.models.config_fields import UnsupportedModelError

#: ``model_type`` of an Idefics3 / SmolVLM checkpoint (``models.vision.config`` reads the
#: same; not imported from there, whose package needs torch).
IDEFICS3_MODEL_TYPE = "idefics3"

#: Where the decoder's tensors live in an Idefics3 checkpoint (the head stays ``lm_head.*``).
_TEXT_PREFIX = "model.text_model."
#: Text-model types the decoder can be (SmolVLM's and Idefics3's are Llamas).
_TEXT_MODEL_TYPES = ("llama",)
#: Top-level keys of the wrapper that describe the decoder too (transformers ties the head
#: by the top-level ``tie_word_embeddings``; the dtype is saved once, at the top).
_WRAPPER_KEYS = ("tie_word_embeddings", "dtype", "torch_dtype")


def vision_family(config: Mapping[str, Any]) -> str | None:
    """The image-text family of a ``config.json`` dict ("idefics3"), or None for a text model."""
    model_type = config.get("model_type")
    return IDEFICS3_MODEL_TYPE if model_type == IDEFICS3_MODEL_TYPE else None


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The decoder's ``config.json`` dict of an Idefics3 config: ``text_config`` with the
    wrapper's tie and dtype, named as the Llama it is.

    Raises UnsupportedModelError when ``text_config`` is missing or not a Llama."""
    text = config.get("text_config")
    if not isinstance(text, Mapping):
        raise UnsupportedModelError("config.json: `text_config` must be an object")
    model_type = text.get("model_type", "llama")
    if model_type not in _TEXT_MODEL_TYPES:
        raise UnsupportedModelError(
            f"config.json: `text_config.model_type` {model_type!r} is not supported; "
            f"supported: {', '.join(_TEXT_MODEL_TYPES)}"
        )
    out = {k: v for k, v in text.items() if k != "architectures"}
    out["model_type"] = model_type
    out["architectures"] = ["LlamaForCausalLM"]
    for key in _WRAPPER_KEYS:
        if key in config:
            out[key] = config[key]
    return out


def stored_text_names(stored: Mapping[str, str]) -> dict[str, str]:
    """Llama tensor name -> the name an Idefics3 checkpoint stores it under, for the
    decoder's tensors among ``stored`` (the checkpoint's names); the vision tower's are left
    out."""
    names = {}
    for name in stored:
        if name.startswith(_TEXT_PREFIX):
            names["model." + name.removeprefix(_TEXT_PREFIX)] = name
        elif name.startswith("lm_head."):
            names[name] = name
    return names
