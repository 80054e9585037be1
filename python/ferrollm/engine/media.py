"""The media of the tracked requests, and the step's embedding overrides built from them.

A request's `MediaInput`s name prompt spans ``[offset, offset + length)`` whose input
embeddings are the encoder's output rows instead of the placeholder token's embedding. The
overrides are computed from the plan's positions each step, so a chunked prefill that cuts
through a span, a prefix-cache hit that skips part of one and a recompute after preemption
all get exactly the rows of the positions they compute. Decode steps compute positions past
the prompt, never in a span: they get no override and keep their compiled graphs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ferrollm._core import StepPlan
from ferrollm.executor.step_extras import EmbeddingOverride
from ferrollm.multimodal.encoder_cache import EncoderCache
from ferrollm.multimodal.inputs import MediaInput, RopePositions


def media_spans(media: Sequence[MediaInput]) -> list[tuple[int, int, str]]:
    """The scheduler's view of a request's media (``NewRequest(media=...)``): each item's
    ``(offset, length, digest)``, the digest naming its kind and content. The prefix cache mixes
    the digests into the blocks each span overlaps (the same text with another image shares the
    blocks before the image, never the image's), and the lengths count against the step's
    encoder budget."""
    return [(item.offset, item.length, f"{item.kind}:{item.digest}") for item in media]


def check_media(media: Sequence[MediaInput], num_prompt_tokens: int) -> None:
    """ValueError naming ``media[i]`` whose span is empty, outside the prompt or overlaps
    the one before it."""
    end = 0
    for i, item in enumerate(media):
        if item.length <= 0 or item.offset < end or item.offset + item.length > num_prompt_tokens:
            raise ValueError(
                f"`media[{i}]`: its span [{item.offset}, {item.offset + item.length}) must be "
                f"non-empty, after the previous item's and within the prompt's "
                f"{num_prompt_tokens} tokens"
            )
        end = item.offset + item.length


class MediaBook:
    """The media of the tracked requests that have some."""

    def __init__(self) -> None:
        self._media: dict[int, tuple[MediaInput, ...]] = {}
        #: M-RoPE positions of the requests whose model rotates by three components.
        self._rope: dict[int, RopePositions] = {}

    def __bool__(self) -> bool:
        return bool(self._media)

    def add(self, key: int, media: Sequence[MediaInput]) -> None:
        """Request ``key``'s prompt spans are filled by ``media`` (in prompt order)."""
        self._media[key] = tuple(media)

    def add_rope(self, key: int, rope: RopePositions) -> None:
        """Request ``key``'s prompt positions are ``rope.table``, later ones its 1-D
        positions plus ``rope.delta`` (M-RoPE; see `rope_positions`)."""
        self._rope[key] = rope

    def remove(self, key: int) -> None:
        """Forget request ``key`` (finished or failed)."""
        self._media.pop(key, None)
        self._rope.pop(key, None)

    def rope_positions(self, plan: StepPlan) -> np.ndarray | None:
        """The step's ``[3, T]`` M-RoPE positions, or None when no request in it has any (its
        1-D positions are then every component's). A request's prompt position ``p`` takes
        its table's column ``p``; a later one ``p + delta`` in all three components; requests
        without a table keep ``p``. Computed from the plan's positions each step, so chunked
        prefills, prefix hits and recomputes get the same positions as one whole prefill."""
        if not self._rope:
            return None
        positions = plan.positions
        out: np.ndarray | None = None
        cu = plan.cu_seqlens_q
        for row, key in enumerate(plan.req_ids.tolist()):
            rope = self._rope.get(key)
            if rope is None:
                continue
            if out is None:
                out = np.repeat(positions[None, :].astype(np.int64), 3, axis=0)
            start, end = int(cu[row]), int(cu[row + 1])
            pos = positions[start:end]
            in_prompt = pos < rope.table.shape[1]
            block = np.where(in_prompt, 0, pos + rope.delta)[None, :].repeat(3, axis=0)
            block[:, in_prompt] = rope.table[:, pos[in_prompt]]
            out[:, start:end] = block
        return out

    def overrides(self, plan: StepPlan, cache: EncoderCache) -> EmbeddingOverride | None:
        """The embeddings of the media positions ``plan`` computes (encoding through
        ``cache`` what it lacks); None when it computes none."""
        if not self._media:
            return None
        cu = plan.cu_seqlens_q
        positions = plan.positions
        token_indices: list[np.ndarray] = []
        wanted: list[tuple[MediaInput, np.ndarray]] = []
        for row, key in enumerate(plan.req_ids.tolist()):
            media = self._media.get(key)
            if media is None:
                continue
            start, end = int(cu[row]), int(cu[row + 1])
            pos = positions[start:end]
            if not len(pos):
                continue
            lo, hi = int(pos.min()), int(pos.max())
            for item in media:
                if item.offset > hi or item.offset + item.length <= lo:
                    continue
                inside = np.flatnonzero((pos >= item.offset) & (pos < item.offset + item.length))
                token_indices.append(start + inside)
                wanted.append((item, pos[inside] - item.offset))
        if not wanted:
            return None
        features = cache.get([item for item, _ in wanted])
        rows = torch.cat(
            [
                output.index_select(0, torch.from_numpy(at).to(output.device))
                for output, (_, at) in zip(features, wanted, strict=True)
            ]
        )
        indices = torch.from_numpy(np.concatenate(token_indices).astype(np.int64))
        return EmbeddingOverride(indices, rows)
