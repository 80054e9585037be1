"""The Qwen2 decoder inside a Qwen2-VL or Qwen2.5-VL checkpoint, seen as a plain Qwen2 causal LM.

A ``Qwen2VLForConditionalGeneration`` directory (and a ``Qwen2_5_VLForConditionalGeneration``
one, whose decoder and layout are the same) keeps its decoder's fields either under
``text_config`` (transformers 5) or at the top level (the original checkpoints), its tensors
under ``model.*`` (or ``model.language_model.*``, transformers 5's in-memory layout) beside
the vision tower's ``visual.*``. The engine runs the decoder as ``Qwen2ForCausalLM``: this
module rewrites the config into that shape and maps tensor names, as ``media_text``'s table
does for the other media families (which defers to it here). Its rope is M-RoPE
(``mrope_section``), which reduces to plain rope wherever the three position components
agree: the config keeps plain rope here, and the multimodal build switches the model's rotary
to three components (`mrope_section`). Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ferrollm.models.config_fields import UnsupportedModelError

#: ``model_type`` of a Qwen2-VL checkpoint.
QWEN2_VL_MODEL_TYPE = "qwen2_vl"
#: ``model_type`` of a Qwen2.5-VL checkpoint (its vision tower differs, not its decoder).
QWEN2_5_VL_MODEL_TYPE = "qwen2_5_vl"
#: The families whose decoder this module reads.
QWEN_VL_MODEL_TYPES = (QWEN2_VL_MODEL_TYPE, QWEN2_5_VL_MODEL_TYPE)

#: Keys of the wrapper that are not the decoder's (the tower, the media token ids).
_NOT_TEXT = ("vision_config", "text_config", "architectures", "model_type", "auto_map")
#: Top-level keys of the wrapper that describe the decoder too.
_WRAPPER_KEYS = ("dtype", "torch_dtype")
#: Tensor prefixes of the decoder (renamed to Qwen2's ``model.``) and of the vision tower.
_TEXT_PREFIXES = ("model.language_model.", "model.")
_VISUAL_PREFIXES = ("visual.", "model.visual.")


def _rope_params(text: Mapping[str, Any]) -> Mapping[str, Any]:
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise UnsupportedModelError(
            "config.json: the text model's rope parameters must be an object"
        )
    return params


def _text_fields(config: Mapping[str, Any]) -> Mapping[str, Any]:
    text = config.get("text_config")
    if text is None:  # the original layout: the decoder's fields at the top level
        return {k: v for k, v in config.items() if k not in _NOT_TEXT}
    if not isinstance(text, Mapping):
        raise UnsupportedModelError("config.json: `text_config` must be an object")
    return text


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The decoder's ``config.json`` dict: a ``Qwen2ForCausalLM`` with plain rope (its
    theta kept; ``mrope`` / ``mrope_section`` dropped, see `mrope_section`)."""
    text = _text_fields(config)
    out = {k: v for k, v in text.items() if k not in ("architectures", "rope_scaling")}
    params = dict(_rope_params(text))
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    if rope_type not in ("default", "mrope"):
        raise UnsupportedModelError(
            f"config.json: Qwen2-VL rope type {rope_type!r} is not supported (default, mrope)"
        )
    params.pop("mrope_section", None)
    params["rope_type"] = "default"
    if "rope_theta" not in params and "rope_theta" in text:
        params["rope_theta"] = text["rope_theta"]
    out["rope_parameters"] = params
    out["model_type"] = "qwen2"
    out["architectures"] = ["Qwen2ForCausalLM"]
    for key in _WRAPPER_KEYS:
        if key in config:
            out[key] = config[key]
    # Tied when either says so, as transformers' Qwen2VLConfig resolves it.
    out["tie_word_embeddings"] = bool(config.get("tie_word_embeddings")) or bool(
        text.get("tie_word_embeddings")
    )
    return out


def mrope_section(config: Mapping[str, Any]) -> tuple[int, ...]:
    """How many of each head's rotary frequencies turn by the temporal, height and width
    position (transformers' default 16/24/24 when the config omits it)."""
    section = _rope_params(_text_fields(config)).get("mrope_section", [16, 24, 24])
    if (
        not isinstance(section, list)
        or len(section) != 3
        or not all(isinstance(s, int) and s >= 0 for s in section)
    ):
        raise UnsupportedModelError(
            f"config.json: `mrope_section` must list 3 non-negative integers; got {section!r}"
        )
    return tuple(section)


def stored_text_names(stored: Mapping[str, str]) -> dict[str, str]:
    """Qwen2 tensor name -> the name a Qwen2-VL checkpoint stores it under, for the
    decoder's tensors among ``stored``; the vision tower's are left out."""
    names = {}
    for name in stored:
        if name.startswith(_VISUAL_PREFIXES):
            continue
        if name.startswith("lm_head."):
            names[name] = name
            continue
        for prefix in _TEXT_PREFIXES:
            if name.startswith(prefix):
                names["model." + name.removeprefix(prefix)] = name
                break
    return names
