"""Building a multimodal engine's media side at engine start: the processor the intake uses
and the encoder (behind its cache) the engine runs, for a checkpoint whose source says it is
an image-text model (``ModelSource.vision_family``); nothing for a text-only one."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ferrollm.executor.source import ModelSource
from ferrollm.multimodal.encoder_cache import EncoderCache
from ferrollm.multimodal.inputs import MultimodalProcessor
from ferrollm.tokenizer import Tokenizer


@dataclass(frozen=True)
class MultimodalParts:
    """What an engine serving media holds: the prompt processor and the encoder cache."""

    processor: MultimodalProcessor
    encoder_cache: EncoderCache


def build_multimodal(
    source: ModelSource, tokenizer: Tokenizer, device: torch.device, dtype: torch.dtype
) -> MultimodalParts | None:
    """The media side of ``source`` on ``device`` in ``dtype`` (the text model's), or None
    for a text-only checkpoint. The vision tower's weights are read from the checkpoint
    directory here (the text model's loader skips them)."""
    if source.vision_family is None:
        return None
    if source.vision_family != "idefics3":
        raise ValueError(f"no media support for the {source.vision_family!r} family")
    from ferrollm.models.vision import load_idefics3_vision
    from ferrollm.multimodal.idefics3 import Idefics3Encoder, Idefics3Processor

    vision = load_idefics3_vision(source.path, device, dtype)
    processor = Idefics3Processor.from_directory(source.path, tokenizer, vision)
    return MultimodalParts(processor, EncoderCache(Idefics3Encoder(vision, device).encode))
