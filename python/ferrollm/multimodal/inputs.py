"""The contract between the intake (server routes, the offline API) and the engine for media.

The intake decodes each media part (``ferrollm.media``) and renders the prompt with one
placeholder per part (`MultimodalProcessor.placeholder`: the text the model's chat template or
MindIE's joined ``text_input`` puts where the part stood). The engine's processor then expands
the placeholders into the model's image/audio tokens and prepares what its encoder takes
(`MultimodalProcessor.process`). The request carries the result as typed values
(`EngineRequest.media`): each `MediaInput` says which prompt positions its embeddings fill.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import torch

    from ferrollm.media.items import MediaItem

MediaKind = Literal["image", "video", "audio"]

#: The rate audio is decoded to for a processor that names none (Whisper's, 16 kHz).
DEFAULT_AUDIO_RATE = 16_000


def audio_rate(processor: object) -> int:
    """The sample rate ``processor`` needs its audio at: its ``sample_rate`` attribute (an
    audio model's feature extractor rate), else `DEFAULT_AUDIO_RATE`. The intake decodes and
    resamples audio to it."""
    rate = getattr(processor, "sample_rate", DEFAULT_AUDIO_RATE)
    return rate if isinstance(rate, int) and rate > 0 else DEFAULT_AUDIO_RATE


@dataclass(frozen=True)
class MediaInput:
    """One media item of a request, ready for the model's encoder.

    ``tensors`` are the encoder's inputs (e.g. ``pixel_values``, ``pixel_attention_mask``);
    ``digest`` names them by content (the encoder cache's key; the prefix cache mixes it into
    the KV blocks the span overlaps, so the same text with another image shares only the
    blocks before the image); the encoder's output has ``length`` rows, which replace the
    embeddings of prompt tokens ``[offset, offset + length)`` (the placeholder tokens the
    processor put there)."""

    kind: MediaKind
    digest: str
    tensors: Mapping[str, torch.Tensor]
    offset: int
    length: int


@dataclass(frozen=True)
class ProcessedPrompt:
    """A prompt with its media expanded: the token ids (placeholder tokens included, so usage
    counts them), the text they came from, and the media in prompt order."""

    prompt: str
    prompt_token_ids: list[int]
    media: tuple[MediaInput, ...]


class MultimodalProcessor(Protocol):
    """A multimodal model's processor (one per engine; ``LLMEngine.multimodal``)."""

    @property
    def modalities(self) -> frozenset[MediaKind]:
        """The media kinds the model takes (``{"image"}`` for an image-text model)."""
        ...

    def placeholder(self, kind: MediaKind) -> str:
        """The text one media part of ``kind`` stands as in a rendered prompt."""
        ...

    def process(
        self, prompt: str, media: Sequence[MediaItem], *, add_special_tokens: bool = True
    ) -> ProcessedPrompt:
        """``prompt`` (one `placeholder` per item of ``media``, in order) tokenized with each
        placeholder expanded, and each item prepared for the encoder. ValueError naming the
        item (``media[i]``) when it cannot be used (count mismatch, a kind the model does not
        take). ``add_special_tokens`` as for a text prompt: True (the default) for a plain
        prompt, False for a rendered chat, whose template wrote its own BOS."""
        ...


@dataclass(frozen=True)
class RopePositions:
    """A prompt's multi-component rotary positions (M-RoPE: temporal, height, width)
    ``[3, num_prompt_tokens]``, and the offset of every later position from its token index
    (the same in all three components)."""

    table: npt.NDArray[np.int64]
    delta: int


@runtime_checkable
class RopePositionsProcessor(Protocol):
    """A processor whose model rotates by M-RoPE positions (Qwen2-VL): the engine asks it
    for each media request's positions and maps the scheduler's 1-D ones through them."""

    def rope_positions(self, num_tokens: int, media: Sequence[MediaInput]) -> RopePositions:
        """The positions of a prompt of ``num_tokens`` tokens whose media fill ``media``'s
        spans."""
        ...
