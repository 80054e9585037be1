"""The text decoder of a media-text checkpoint, whichever family wraps it.

Each supported family (Idefics3 / SmolVLM images, Qwen2-Audio audio) stores an ordinary
decoder under its own config key and tensor prefix; this module picks the family's rewriting
(``idefics3_text``, ``qwen2_audio_text``) so the loader stays free of family branches.
Torch-free, like the config readers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ferrollm.models import idefics3_text, qwen2_audio_text


def media_family(config: Mapping[str, Any]) -> str | None:
    """The media-text family of a ``config.json`` dict ("idefics3", "qwen2_audio"), or None
    for a text model."""
    model_type = config.get("model_type")
    if model_type == idefics3_text.IDEFICS3_MODEL_TYPE:
        return idefics3_text.IDEFICS3_MODEL_TYPE
    if model_type == qwen2_audio_text.QWEN2_AUDIO_MODEL_TYPE:
        return qwen2_audio_text.QWEN2_AUDIO_MODEL_TYPE
    return None


def text_config(family: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The decoder's own ``config.json`` dict inside a ``family`` config."""
    if family == qwen2_audio_text.QWEN2_AUDIO_MODEL_TYPE:
        return qwen2_audio_text.text_config(config)
    return idefics3_text.text_config(config)


def stored_text_names(family: str, stored: Mapping[str, str]) -> dict[str, str]:
    """The decoder's tensor name -> its stored name, for a ``family`` checkpoint."""
    if family == qwen2_audio_text.QWEN2_AUDIO_MODEL_TYPE:
        return qwen2_audio_text.stored_text_names(stored)
    return idefics3_text.stored_text_names(stored)
