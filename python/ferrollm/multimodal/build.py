"""Building a multimodal engine's media side at engine start: the processor the intake uses
and the encoder (behind its cache) the engine runs, for a checkpoint whose source says it is
a media-text model (``ModelSource.vision_family``: "idefics3" images, "qwen2_audio" audio,
"qwen2_vl" and "qwen2_5_vl" images and videos); nothing for a text-only one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ferrollm.executor.source import ModelSource
from ferrollm.models.qwen2_vl_text import QWEN_VL_MODEL_TYPES
from ferrollm.multimodal.encoder_cache import EncoderCache
from ferrollm.multimodal.inputs import MultimodalProcessor
from ferrollm.tokenizer import Tokenizer

if TYPE_CHECKING:
    from ferrollm.models.audio import Qwen2AudioTower
    from ferrollm.models.vision import Idefics3Vision


@dataclass(frozen=True)
class MultimodalParts:
    """What an engine serving media holds: the prompt processor and the encoder cache, and
    for an M-RoPE decoder (Qwen2-VL, Qwen2.5-VL) the rotary sections to switch the text
    model's rope to (`install_mrope`)."""

    processor: MultimodalProcessor
    encoder_cache: EncoderCache
    mrope_section: tuple[int, ...] | None = None


def build_multimodal(
    source: ModelSource, tokenizer: Tokenizer, device: torch.device, dtype: torch.dtype
) -> MultimodalParts | None:
    """The media side of ``source`` on ``device`` in ``dtype`` (the text model's), or None
    for a text-only checkpoint. The media encoder's weights are read from the checkpoint
    directory here (the text model's loader skips them); with ``load_format`` dummy they are
    random, as the text model's are."""
    if source.vision_family is None:
        return None
    if source.vision_family == "qwen2_audio":
        return _build_qwen2_audio(source, tokenizer, device, dtype)
    if source.vision_family in QWEN_VL_MODEL_TYPES:
        return _build_qwen2_vl(source, tokenizer, device, dtype)
    if source.vision_family != "idefics3":
        raise ValueError(f"no media support for the {source.vision_family!r} family")
    from ferrollm.models.vision import load_idefics3_vision
    from ferrollm.multimodal.idefics3 import Idefics3Encoder, Idefics3Processor

    if source.dummy_weights:
        vision = _dummy_idefics3_vision(source, device, dtype)
    else:
        vision = load_idefics3_vision(source.path, device, dtype)
    processor = Idefics3Processor.from_directory(source.path, tokenizer, vision)
    return MultimodalParts(processor, EncoderCache(Idefics3Encoder(vision, device).encode))


def _build_qwen2_audio(
    source: ModelSource, tokenizer: Tokenizer, device: torch.device, dtype: torch.dtype
) -> MultimodalParts:
    """A Qwen2-Audio checkpoint's audio tower (random with ``load_format`` dummy), its
    processor and encoder cache."""
    from ferrollm.models.audio import load_qwen2_audio_tower
    from ferrollm.multimodal.qwen2_audio import Qwen2AudioEncoder, Qwen2AudioProcessor

    tower: Qwen2AudioTower
    if source.dummy_weights:
        from ferrollm.executor.dummy_weights import fill_dummy_weights
        from ferrollm.models.audio.qwen2_audio import new_qwen2_audio_tower

        tower = new_qwen2_audio_tower(source.path, device, dtype)
        fill_dummy_weights(tower)
        tower.eval()
        tower.requires_grad_(False)
    else:
        tower = load_qwen2_audio_tower(source.path, device, dtype)
    processor = Qwen2AudioProcessor.from_directory(source.path, tokenizer, tower)
    return MultimodalParts(processor, EncoderCache(Qwen2AudioEncoder(tower, device).encode))


def _dummy_idefics3_vision(
    source: ModelSource, device: torch.device, dtype: torch.dtype
) -> Idefics3Vision:
    """The vision tower's shape with random weights (``load_format`` dummy reads no file)."""
    import json

    from ferrollm.executor.dummy_weights import fill_dummy_weights
    from ferrollm.models.vision import Idefics3Config, Idefics3Vision

    raw = json.loads((source.path / "config.json").read_text(encoding="utf-8"))
    with torch.device("meta"):
        vision = Idefics3Vision(Idefics3Config.from_hf_dict(raw))
    vision = vision.to(dtype=dtype).to_empty(device=device)
    fill_dummy_weights(vision)
    vision.eval()
    vision.requires_grad_(False)
    return vision


def _build_qwen2_vl(
    source: ModelSource, tokenizer: Tokenizer, device: torch.device, dtype: torch.dtype
) -> MultimodalParts:
    import json

    from ferrollm.models.qwen2_vl_text import mrope_section
    from ferrollm.models.vision.qwen2_vl import build_qwen2_vl_vision
    from ferrollm.multimodal.qwen2_vl import Qwen2VLEncoder, Qwen2VLProcessor

    raw = json.loads((source.path / "config.json").read_text(encoding="utf-8"))
    vision = build_qwen2_vl_vision(source.path, device, dtype, dummy=source.dummy_weights)
    processor = Qwen2VLProcessor.from_directory(source.path, tokenizer, vision, raw)
    encoder = EncoderCache(Qwen2VLEncoder(vision, device).encode)
    return MultimodalParts(processor, encoder, mrope_section(raw))


def install_mrope(model: object, section: tuple[int, ...]) -> None:
    """Switch ``model``'s rotary embedding to M-RoPE over ``section`` (it then takes
    ``[3, T]`` positions; 1-D positions, as compiled decode graphs use, rotate as before).
    ValueError when the model has no such rope or the sections do not cover its
    frequencies."""
    from ferrollm.layers.rotary import RotaryEmbedding

    rotary = getattr(model, "rotary", None)
    if not isinstance(rotary, RotaryEmbedding) or rotary.interleaved:
        raise ValueError(f"{type(model).__name__} has no rotary embedding M-RoPE can drive")
    if sum(section) != rotary.rotary_dim // 2:
        raise ValueError(
            f"config.json: `mrope_section` {list(section)} must sum to half the rotary "
            f"dims ({rotary.rotary_dim // 2})"
        )
    rotary.mrope_section = section
