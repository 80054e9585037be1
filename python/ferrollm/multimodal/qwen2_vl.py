"""Qwen2-VL / Qwen2.5-VL-style models on the engine side: the prompt processor (images and
videos) with each prompt's M-RoPE positions, and the encoder.

The chat template writes an image as ``<|vision_start|><|image_pad|><|vision_end|>`` (a video
with ``<|video_pad|>``); `Qwen2VLProcessor.process` repeats each pad token once per merged
token of its item (``t*h*w / merge^2``), as transformers' processor does, and tokenizes the
result. Each item is one `MediaInput` over its run of pad tokens.

Positions: the decoder rotates by three components (temporal, height, width). A text token has
all three at one value; an item's tokens take ``start + (frame, row, column)`` of their merged
grid, and the text after it resumes at ``start + max(rows, columns)``. So a prompt's positions
differ from token indices after its first item; past the prompt (generated tokens) every
position is the token index plus one per-request offset (``delta``). `rope_positions` computes
both from the prompt's media spans; the engine maps the scheduler's 1-D positions through them
each step (``engine.media.MediaBook``), so the scheduler keeps counting tokens.

Qwen2.5-VL spaces a video's temporal positions by time: frame group ``i`` (``temporal_patch_size``
frames) sits at ``int(i * tokens_per_second * second_per_grid_t)`` past the start, where
``second_per_grid_t`` is ``temporal_patch_size`` over the sampled frame rate (transformers'
``VideoMetadata.sampled_fps``: frames kept over frames in the stream times its rate, 24 when the
rate is unknown). Each video input carries it, and its digest names it, since the same frames at
another rate take other positions (so other KV in the prefix cache).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ferrollm.media.items import ImageMedia, MediaItem, VideoMedia
from ferrollm.models.vision.qwen2_vl import Qwen2VLVision
from ferrollm.models.vision.qwen2_vl_images import Patches, Qwen2VLImageSettings, preprocess_image
from ferrollm.models.vision.qwen2_vl_video import preprocess_video
from ferrollm.multimodal.inputs import MediaInput, MediaKind, ProcessedPrompt, RopePositions
from ferrollm.tokenizer import Tokenizer

IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
PAD_TOKENS: dict[MediaKind, str] = {"image": IMAGE_PAD, "video": VIDEO_PAD}
_PLACEHOLDERS = {
    "image": f"<|vision_start|>{IMAGE_PAD}<|vision_end|>",
    "video": f"<|vision_start|>{VIDEO_PAD}<|vision_end|>",
}
_PIXELS = "pixel_values"
_GRID = "grid_thw"
_SECONDS = "second_per_grid_t"
#: transformers' frame rate for a video whose rate is unknown (``VideoMetadata.sampled_fps``).
_DEFAULT_FPS = 24.0


def patches_digest(kind: MediaKind, patches: Patches, timing: str = "") -> str:
    """A name for one item's encoder input by content: kind, grid, pixel bytes and ``timing``
    (a video's seconds per temporal patch where its positions depend on them)."""
    digest = hashlib.sha256(
        f"{kind}{patches.grid_thw}{patches.pixel_values.shape}{timing}".encode()
    )
    digest.update(patches.pixel_values.tobytes())
    return f"qwen2-vl-{kind}:{digest.hexdigest()}"


def sampled_fps(video: VideoMedia) -> float:
    """The rate of ``video``'s kept frames, as transformers' ``VideoMetadata.sampled_fps``."""
    if video.fps <= 0 or video.total_frames <= 0:
        return _DEFAULT_FPS
    return len(video.indices) / video.total_frames * video.fps


class Qwen2VLProcessor:
    """The `MultimodalProcessor` of a Qwen2-VL or Qwen2.5-VL checkpoint (images and videos)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        image_settings: Qwen2VLImageSettings,
        video_settings: Qwen2VLImageSettings,
        pad_token_ids: dict[MediaKind, int],
        tokens_per_second: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.image_settings = image_settings
        self.video_settings = video_settings
        #: The pad token each kind's features replace.
        self.pad_token_ids = pad_token_ids
        #: Qwen2.5-VL: temporal positions a second of video spans; None: one per frame group.
        self.tokens_per_second = tokens_per_second

    @classmethod
    def from_directory(
        cls,
        directory: Path,
        tokenizer: Tokenizer,
        vision: Qwen2VLVision,
        raw_config: Mapping[str, Any],
    ) -> Qwen2VLProcessor:
        """The processor of the checkpoint in ``directory`` (its preprocessor settings, whose
        patch and merge sizes must be the tower's)."""
        image, video = Qwen2VLImageSettings.from_directory(directory)
        config = vision.config
        for settings in (image, video):
            if (
                settings.patch_size != config.patch_size
                or settings.merge_size != config.spatial_merge_size
                or settings.temporal_patch_size != config.temporal_patch_size
            ):
                raise ValueError(
                    "preprocessor_config.json: `patch_size`, `merge_size` and "
                    "`temporal_patch_size` must equal the vision tower's"
                )
        pads: dict[MediaKind, int] = {
            "image": int(raw_config.get("image_token_id", 151655)),
            "video": int(raw_config.get("video_token_id", 151656)),
        }
        return cls(tokenizer, image, video, pads, config.tokens_per_second or None)

    @property
    def modalities(self) -> frozenset[MediaKind]:
        """Images and videos."""
        return frozenset({"image", "video"})

    def placeholder(self, kind: MediaKind) -> str:
        """What the chat template writes for a part of ``kind``."""
        if kind not in _PLACEHOLDERS:
            raise ValueError(f"this model takes images and videos, not {kind}")
        return _PLACEHOLDERS[kind]

    def process(
        self, prompt: str, media: Sequence[MediaItem], *, add_special_tokens: bool = True
    ) -> ProcessedPrompt:
        """See `MultimodalProcessor.process`. As transformers' processor takes images and
        videos as two lists, the i-th image pad of the prompt stands for the i-th image of
        ``media`` and likewise for videos, so ``media`` may list one kind after the other (the
        offline API's ``multi_modal_data``) or both in prompt order (the chat intake's)."""
        pads = _pad_tokens_in_order(prompt)
        queues: dict[MediaKind, list[tuple[int, MediaItem]]] = {"image": [], "video": []}
        for i, item in enumerate(media):
            if isinstance(item, ImageMedia):
                queues["image"].append((i, item))
            elif isinstance(item, VideoMedia):
                queues["video"].append((i, item))
            else:
                raise ValueError(f"`media[{i}]`: this model takes images and videos only")
        for kind, queue in queues.items():
            count = sum(k == kind for k, _ in pads)
            if count != len(queue):
                at = queue[count][0] if count < len(queue) else len(media)
                raise ValueError(
                    f"`media[{at}]`: the prompt has {count} {PAD_TOKENS[kind]} placeholders "
                    f"for {len(queue)} {kind}s"
                )
        ordered = [queues[kind][i][1] for kind, i in _ranks(pads)]
        items = [self._preprocess(item) for item in ordered]
        merge = self.image_settings.merge_size**2
        pieces, last = [], 0
        for (kind, start), (_, patches) in zip(pads, items, strict=True):
            t, h, w = patches.grid_thw
            pad = PAD_TOKENS[kind]
            pieces += [prompt[last:start], pad * (t * h * w // merge)]
            last = start + len(pad)
        text = "".join([*pieces, prompt[last:]])
        token_ids = self.tokenizer.encode(text, add_special_tokens)
        runs = _pad_runs(token_ids, set(self.pad_token_ids.values()))
        expected = [t * h * w // merge for _, p in items for t, h, w in [p.grid_thw]]
        if [n for _, n in runs] != expected:
            raise ValueError(
                f"`prompt`: its {IMAGE_PAD}/{VIDEO_PAD} tokens do not form one run per media "
                "item (does the text hold stray pad tokens next to a placeholder?)"
            )
        inputs = tuple(
            self._encoder_input(item, patches, span)
            for item, (_, patches), span in zip(ordered, items, runs, strict=True)
        )
        return ProcessedPrompt(text, token_ids, inputs)

    def _preprocess(self, item: MediaItem) -> tuple[MediaKind, Patches]:
        if isinstance(item, ImageMedia):
            return "image", preprocess_image(item.image, self.image_settings)
        assert isinstance(item, VideoMedia)
        return "video", preprocess_video(item.frames, self.video_settings)

    def _encoder_input(
        self, item: MediaItem, patches: Patches, span: tuple[int, int]
    ) -> MediaInput:
        """``item``'s `MediaInput` over the prompt tokens ``span`` (offset, length); a
        Qwen2.5-VL video's carries its seconds per temporal patch too."""
        kind: MediaKind = "video" if isinstance(item, VideoMedia) else "image"
        tensors = {
            _PIXELS: torch.from_numpy(patches.pixel_values),
            _GRID: torch.tensor([patches.grid_thw], dtype=torch.int64),
        }
        timing = ""
        if isinstance(item, VideoMedia) and self.tokens_per_second is not None:
            seconds = self.video_settings.temporal_patch_size / sampled_fps(item)
            tensors[_SECONDS] = torch.tensor([seconds], dtype=torch.float32)
            timing = f"{seconds!r}s"
        return MediaInput(kind, patches_digest(kind, patches, timing), tensors, *span)

    def rope_positions(self, num_tokens: int, media: Sequence[MediaInput]) -> RopePositions:
        """The M-RoPE positions of a prompt of ``num_tokens`` tokens whose media fill
        ``media``'s spans (as transformers' ``get_rope_index`` gives them)."""
        merge = self.image_settings.merge_size
        parts: list[npt.NDArray[np.int64]] = []
        index = start = 0
        for item in media:
            text = item.offset - index
            parts.append(np.broadcast_to(np.arange(start, start + text), (3, text)))
            start += text
            t, h, w = (int(v) for v in item.tensors[_GRID][0].tolist())
            h, w = h // merge, w // merge
            times = self._temporal_positions(item, t)
            grid = np.stack(np.meshgrid(times, np.arange(h), np.arange(w), indexing="ij"))
            parts.append(grid.reshape(3, -1) + start)
            start += max(h, w)
            index = item.offset + item.length
        text = num_tokens - index
        parts.append(np.broadcast_to(np.arange(start, start + text), (3, text)))
        table = np.ascontiguousarray(np.concatenate(parts, axis=1), dtype=np.int64)
        return RopePositions(table, int(table.max()) + 1 - num_tokens)

    def _temporal_positions(self, item: MediaInput, t: int) -> npt.NDArray[np.int64]:
        """The temporal position (from 0) of each of ``item``'s ``t`` frame groups: their
        index, or for a Qwen2.5-VL video their time in ``tokens_per_second`` units, rounded
        down (float32 arithmetic, as transformers' ``get_rope_index``)."""
        if _SECONDS not in item.tensors or self.tokens_per_second is None:
            return np.arange(t, dtype=np.int64)
        step = np.float32(self.tokens_per_second) * np.float32(item.tensors[_SECONDS][0])
        times: npt.NDArray[np.int64] = (np.arange(t, dtype=np.float32) * step).astype(np.int64)
        return times


def _pad_tokens_in_order(prompt: str) -> list[tuple[MediaKind, int]]:
    """Each image/video pad token of ``prompt`` with its character offset, in order."""
    found: list[tuple[MediaKind, int]] = []
    for kind, pad in PAD_TOKENS.items():
        at = prompt.find(pad)
        while at >= 0:
            found.append((kind, at))
            at = prompt.find(pad, at + len(pad))
    return sorted(found, key=lambda pair: pair[1])


def _ranks(pads: list[tuple[MediaKind, int]]) -> list[tuple[MediaKind, int]]:
    """Each pad's kind and its rank among that kind's pads (the i-th image pad: image i)."""
    seen = {"image": 0, "video": 0}
    ranks = []
    for kind, _ in pads:
        ranks.append((kind, seen[kind]))
        seen[kind] += 1
    return ranks


def _pad_runs(token_ids: Sequence[int], pad_ids: set[int]) -> list[tuple[int, int]]:
    """(start, length) of each maximal run of one pad token in ``token_ids``."""
    runs: list[tuple[int, int]] = []
    for i, token in enumerate(token_ids):
        if token not in pad_ids:
            continue
        if runs and runs[-1][0] + runs[-1][1] == i and token_ids[i - 1] == token:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


class Qwen2VLEncoder:
    """Images and videos -> their pad tokens' embeddings, through the vision tower."""

    def __init__(self, vision: Qwen2VLVision, device: torch.device) -> None:
        self.vision = vision
        self.device = device

    def encode(self, items: Sequence[MediaInput]) -> list[torch.Tensor]:
        """One ``[length, text hidden]`` tensor per item (all items in one pass)."""
        dtype = self.vision.patch_embed.proj.weight.dtype
        pixels = torch.cat([item.tensors[_PIXELS] for item in items]).to(self.device, dtype)
        grids = torch.cat([item.tensors[_GRID] for item in items])
        return self.vision.features(pixels, grids)
