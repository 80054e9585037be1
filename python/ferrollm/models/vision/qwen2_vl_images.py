"""Qwen2-VL's image preprocessing: smart resize, normalize, patchify (videos: ``qwen2_vl_video``).

Each image is resized (Pillow, bicubic by default, on 8-bit RGB as transformers' Pillow image
processor does, so the arrays are the same) to the nearest size whose sides are multiples of
``patch_size * merge_size`` within ``[min_pixels, max_pixels]`` (`smart_resize`), rescaled and
normalized per channel, then cut into ``patch_size``^2 patches laid out block by block: the
``merge_size``^2 patches one merged token takes are adjacent rows. A patch repeats its frame
``temporal_patch_size`` times (the tower's convolution is 3-D); a video's frames are padded to a
multiple of it with the last frame and paired instead. Each item becomes ``[t*h*w, C*T*P*P]``
float32 patches and its grid ``(t, h, w)`` in patches.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ferrollm.models.vision.idefics3_images import _as_rgb

if TYPE_CHECKING:
    from PIL.Image import Image

BICUBIC = 3
#: OpenAI CLIP's per-channel mean and std (transformers' defaults for Qwen2-VL).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class Qwen2VLImageSettings:
    """``preprocessor_config.json`` (or the video one) as the preprocessing reads it. The last
    three fields are the video processor's: its per-frame pixel cap (off, its default when
    unset), the token budget that cap shares out, and frame sampling (off by default; when a
    checkpoint turns it on, the intake's uniform sample is still what is used)."""

    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    do_resize: bool = True
    resample: int = BICUBIC
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD
    do_convert_rgb: bool = True
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 128000
    do_sample_frames: bool = False

    @classmethod
    def from_dict(
        cls, raw: Mapping[str, Any], defaults: Qwen2VLImageSettings | None = None
    ) -> Qwen2VLImageSettings:
        """From a preprocessor config dict (``size`` or the older ``min_pixels`` /
        ``max_pixels``); absent keys take ``defaults``' values (transformers' by default)."""
        base = defaults or cls()
        size = raw.get("size") or {}
        min_pixels = raw.get("min_pixels") or size.get("shortest_edge") or base.min_pixels
        max_pixels = raw.get("max_pixels") or size.get("longest_edge") or base.max_pixels

        def get(key: str) -> Any:
            value = raw.get(key)
            return getattr(base, key) if value is None else value

        return cls(
            min_pixels=int(min_pixels),
            max_pixels=int(max_pixels),
            patch_size=int(get("patch_size")),
            temporal_patch_size=int(get("temporal_patch_size")),
            merge_size=int(get("merge_size")),
            do_resize=bool(get("do_resize")),
            resample=int(get("resample")),
            do_rescale=bool(get("do_rescale")),
            rescale_factor=float(get("rescale_factor")),
            do_normalize=bool(get("do_normalize")),
            image_mean=tuple(float(v) for v in get("image_mean")),
            image_std=tuple(float(v) for v in get("image_std")),
            do_convert_rgb=bool(get("do_convert_rgb")),
            cap_pixels_per_frame=bool(get("cap_pixels_per_frame")),
            max_video_tokens=int(get("max_video_tokens")),
            do_sample_frames=bool(get("do_sample_frames")),
        )

    @classmethod
    def from_directory(cls, directory: Path) -> tuple[Qwen2VLImageSettings, Qwen2VLImageSettings]:
        """Image and video settings of a checkpoint, read as transformers reads them. Image:
        ``processor_config.json``'s ``image_processor``, else ``preprocessor_config.json``.
        Video: the first of ``processor_config.json``'s ``video_processor``,
        ``video_preprocessor_config.json`` and ``preprocessor_config.json``, over the video
        processor's defaults (128 to 768 merged tokens a frame) for absent keys."""
        processor = _read_json(directory / "processor_config.json")
        image_file = _read_json(directory / "preprocessor_config.json")
        video_raw = (
            _nested(processor, "video_processor")
            or _read_json(directory / "video_preprocessor_config.json")
            or image_file
        )
        video_defaults = cls(min_pixels=128 * 28 * 28, max_pixels=28 * 28 * 768)
        image = cls.from_dict(_nested(processor, "image_processor") or image_file)
        return image, cls.from_dict(video_raw, video_defaults)


@dataclass(frozen=True)
class Patches:
    """One item's patches ``[t*h*w, C*T*P*P]`` (float32) and grid ``(t, h, w)``."""

    pixel_values: npt.NDArray[np.float32]
    grid_thw: tuple[int, int, int]


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """The size nearest ``height`` x ``width`` whose sides are multiples of ``factor`` and
    whose area is within ``[min_pixels, max_pixels]``, the aspect ratio kept as far as can be
    (transformers' rule, rounding included)."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"an image's aspect ratio must be under 200; got {height}x{width} pixels")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def preprocess_image(image: Image, settings: Qwen2VLImageSettings) -> Patches:
    """One image's patches (its frame repeated ``temporal_patch_size`` times)."""
    image = _as_rgb(image, settings.do_convert_rgb)
    if settings.do_resize:
        factor = settings.patch_size * settings.merge_size
        height, width = smart_resize(
            image.height, image.width, factor, settings.min_pixels, settings.max_pixels
        )
        image = image.resize((width, height), resample=settings.resample)
    frame = _normalized(np.asarray(image).transpose(2, 0, 1), settings)
    frames = np.broadcast_to(frame[None], (settings.temporal_patch_size, *frame.shape))
    return _patchify(frames, settings)


def _normalized(
    pixels: npt.NDArray[Any], settings: Qwen2VLImageSettings
) -> npt.NDArray[np.float32]:
    """CHW uint8 -> float32: rescaled in float64 then cast, then ``(x - mean) / std`` per
    channel in float32 (the Pillow processor's order and precision)."""
    scaled = pixels.astype(np.float64) * settings.rescale_factor if settings.do_rescale else pixels
    out: npt.NDArray[np.float32] = scaled.astype(np.float32)
    if settings.do_normalize:
        mean = np.asarray(settings.image_mean, dtype=np.float32)[:, None, None]
        std = np.asarray(settings.image_std, dtype=np.float32)[:, None, None]
        out = (out - mean) / std
    return out


def _patchify(frames: npt.NDArray[np.float32], settings: Qwen2VLImageSettings) -> Patches:
    """``[F, C, H, W]`` (F a multiple of ``temporal_patch_size``) -> flat patches, each merge
    block's patches adjacent, each patch's ``temporal_patch_size`` frames inside it."""
    p, m, tp = settings.patch_size, settings.merge_size, settings.temporal_patch_size
    count, channels, height, width = frames.shape
    t, h, w = count // tp, height // p, width // p
    blocks = frames.reshape(t, tp, channels, h // m, m, p, w // m, m, p)
    # -> (t, h/m, w/m, m, m, C, tp, p, p)
    blocks = blocks.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = np.ascontiguousarray(blocks.reshape(t * h * w, channels * tp * p * p), dtype=np.float32)
    return Patches(flat, (t, h, w))


def _nested(raw: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``raw[key]`` where it is a dict (transformers 5 nests each part's config there)."""
    value = raw.get(key)
    return value if isinstance(value, dict) else {}


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}
