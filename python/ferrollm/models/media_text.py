"""The text decoder inside a media-text checkpoint, seen as a plain causal LM.

Each supported family stores an ordinary decoder under its config's ``text_config`` and its
own tensor prefixes, beside the encoder's tensors (loaded apart: ``ferrollm.multimodal``):

- Idefics3 / SmolVLM (images): a Llama under ``model.text_model.*``, its head ``lm_head.*``;
  the wrapper's top-level ``tie_word_embeddings`` ties the head (transformers reads it there).
- Qwen2-VL and Qwen2.5-VL (images, videos): a Qwen2 whose fields sit under ``text_config`` or,
  in the original checkpoints, at the top level, with M-RoPE; its layout differs enough to be
  read by ``ferrollm.models.qwen2_vl_text``, which `text_config` and `stored_text_names` defer
  to.
- Qwen2-Audio (audio): a Qwen2 under ``language_model.model.*`` / ``language_model.lm_head.*``
  (the layout transformers saves, ``language_model.model.model.*`` from 5.17), or
  transformers 5's in-memory layout (``model.language_model.*``, ``lm_head.*``) should a tool
  save that.

The engine runs that decoder with its ordinary model class: `text_config` rewrites the config
into the decoder's own ``config.json`` shape and `stored_text_names` maps the decoder's tensor
names to where the checkpoint stores them, so the loader needs one lookup and no family
branch. Torch-free, like the config readers, so opening a directory (``ferrollm.preflight``)
still needs no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ferrollm.models import qwen2_vl_text
from ferrollm.models.config_fields import UnsupportedModelError

#: ``model_type`` of an Idefics3 / SmolVLM checkpoint (``models.vision.config`` reads the
#: same; not imported from there, whose package needs torch).
IDEFICS3_MODEL_TYPE = "idefics3"
#: ``model_type`` of a Qwen2-Audio checkpoint.
QWEN2_AUDIO_MODEL_TYPE = "qwen2_audio"


@dataclass(frozen=True)
class WrappedDecoder:
    """Where a media-text family keeps its decoder."""

    #: The decoder's ``model_type`` when ``text_config`` leaves it out (as transformers does).
    default_type: str
    #: The decoder types this family's checkpoints use (our model class runs them).
    text_types: tuple[str, ...]
    #: The decoder's architecture as a plain causal LM.
    architecture: str
    #: Stored prefix -> the decoder's own prefix, first match wins.
    prefixes: tuple[tuple[str, str], ...]
    #: Top-level keys of the wrapper that describe the decoder too (the dtype is saved once,
    #: at the top); ``wrapper_wins``: they override ``text_config``'s own.
    wrapper_keys: tuple[str, ...] = ("dtype", "torch_dtype")
    wrapper_wins: bool = False


FAMILIES: dict[str, WrappedDecoder] = {
    IDEFICS3_MODEL_TYPE: WrappedDecoder(
        default_type="llama",
        text_types=("llama",),
        architecture="LlamaForCausalLM",
        prefixes=(("model.text_model.", "model."), ("lm_head.", "lm_head.")),
        wrapper_keys=("tie_word_embeddings", "dtype", "torch_dtype"),
        wrapper_wins=True,
    ),
    QWEN2_AUDIO_MODEL_TYPE: WrappedDecoder(
        default_type="qwen2",
        text_types=("qwen2",),
        architecture="Qwen2ForCausalLM",
        prefixes=(
            # transformers 5.17's save_pretrained writes the decoder one level deeper; its
            # loader and ours read it back.
            ("language_model.model.model.", "model."),
            ("language_model.model.", "model."),
            ("language_model.lm_head.", "lm_head."),
            ("model.language_model.", "model."),
            ("lm_head.", "lm_head."),
        ),
    ),
}


def media_family(config: Mapping[str, Any]) -> str | None:
    """The media-text family of a ``config.json`` dict (its ``model_type``: "idefics3",
    "qwen2_audio", "qwen2_vl", "qwen2_5_vl"), or None for a text model."""
    model_type = config.get("model_type")
    known = model_type in FAMILIES or model_type in qwen2_vl_text.QWEN_VL_MODEL_TYPES
    return model_type if known else None


def text_config(family: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The decoder's own ``config.json`` dict inside a ``family`` config.

    Raises UnsupportedModelError when ``text_config`` is missing or of a type the family's
    decoder is not."""
    if family in qwen2_vl_text.QWEN_VL_MODEL_TYPES:
        return qwen2_vl_text.text_config(config)
    wrapped = FAMILIES[family]
    text = config.get("text_config")
    if not isinstance(text, Mapping):
        raise UnsupportedModelError("config.json: `text_config` must be an object")
    model_type = text.get("model_type", wrapped.default_type)
    if model_type not in wrapped.text_types:
        raise UnsupportedModelError(
            f"config.json: `text_config.model_type` {model_type!r} is not supported; "
            f"supported: {', '.join(wrapped.text_types)}"
        )
    out = {k: v for k, v in text.items() if k != "architectures"}
    out["model_type"] = model_type
    out["architectures"] = [wrapped.architecture]
    for key in wrapped.wrapper_keys:
        if key in config and (wrapped.wrapper_wins or key not in out):
            out[key] = config[key]
    return out


def stored_text_names(family: str, stored: Mapping[str, str]) -> dict[str, str]:
    """The decoder's tensor name -> the name a ``family`` checkpoint stores it under, for the
    decoder's tensors among ``stored`` (the checkpoint's names); the encoder's are left out."""
    if family in qwen2_vl_text.QWEN_VL_MODEL_TYPES:
        return qwen2_vl_text.stored_text_names(stored)
    names = {}
    for name in stored:
        for prefix, ours in FAMILIES[family].prefixes:
            if name.startswith(prefix):
                names[ours + name.removeprefix(prefix)] = name
                break
    return names
