"""Qwen2-VL's video preprocessing, equal to transformers' ``Qwen2VLVideoProcessor`` bit for bit.

transformers' video processors work on torch tensors through torchvision: the frames
``[F, H, W, 3]`` become one contiguous uint8 ``[F, 3, H, W]`` tensor, resized at once to the
smart size by ``torchvision.transforms.v2.functional.resize``, then rescaled and normalized in
one fused step, then patchified. This module does the same with torch ops alone (ferrollm does
not need torchvision): torchvision's resize of a uint8 CPU tensor is
``torch.nn.functional.interpolate`` on the uint8 tensor itself for bicubic (and for bilinear
where the CPU has AVX2/AVX-512 or is ARM), with ``align_corners=False`` and antialiasing;
otherwise it goes through float32 and rounds (and clamps, for bicubic) back to uint8. The fused
rescale-normalize is ``(x - mean / factor) / (std / factor)`` in float32 with ``mean`` and
``std`` as float32 tensors scaled by ``1 / rescale_factor``.

Frames are taken as given: the processor's ``do_sample_frames`` is off by default (its class
default), so it keeps every frame it is handed; the intake's frames are its uniform sample
(``ferrollm.media.video``). A config that turns sampling on is not followed yet. An odd count
is padded with the last frame to a multiple of ``temporal_patch_size``.
"""

from __future__ import annotations

import platform

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from ferrollm.models.vision.qwen2_vl_images import (
    Patches,
    Qwen2VLImageSettings,
    _patchify,
    smart_resize,
)

#: PIL resampling codes -> torch interpolation modes, as transformers maps them to
#: torchvision's (NEAREST is torchvision's NEAREST_EXACT). BOX, HAMMING and LANCZOS have no
#: ``interpolate`` mode.
_MODES = {0: "nearest-exact", 2: "bilinear", 3: "bicubic"}


def preprocess_video(frames: npt.NDArray[np.uint8], settings: Qwen2VLImageSettings) -> Patches:
    """A video's patches from its frames ``[F, H, W, 3]`` uint8 (all of them, as the
    processor with ``do_sample_frames`` off): every frame resized to the same smart size, the
    count padded to a multiple of ``temporal_patch_size`` with the last frame."""
    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).contiguous()
    count, _, height, width = video.shape
    if settings.do_resize:
        factor = settings.patch_size * settings.merge_size
        max_pixels = frame_pixel_cap(settings, count)
        height, width = smart_resize(height, width, factor, settings.min_pixels, max_pixels)
        video = resize_uint8(video, height, width, settings.resample)
    pixels = rescaled_and_normalized(video, settings).numpy()
    pad = -count % settings.temporal_patch_size
    if pad:
        pixels = np.concatenate([pixels, np.repeat(pixels[-1:], pad, axis=0)])
    return _patchify(pixels, settings)


def frame_pixel_cap(settings: Qwen2VLImageSettings, num_frames: int) -> int:
    """The most pixels a frame may keep: ``max_pixels``, or with ``cap_pixels_per_frame`` also
    an even share of 90% of ``max_video_tokens`` tokens' pixels (floored at 1.05 x
    ``min_pixels``), as the processor bounds a long video."""
    if not settings.cap_pixels_per_frame:
        return settings.max_pixels
    factor = settings.patch_size * settings.merge_size
    total = int(settings.max_video_tokens * factor * factor * 0.9)
    share = total * settings.temporal_patch_size // num_frames
    return max(min(settings.max_pixels, share), int(settings.min_pixels * 1.05))


def resize_uint8(video: torch.Tensor, height: int, width: int, resample: int) -> torch.Tensor:
    """``video`` ``[F, C, H, W]`` uint8 resized to ``height`` x ``width`` as torchvision's
    ``resize(..., antialias=True)`` does on the CPU (unchanged where the size is already it)."""
    if resample not in _MODES:
        raise ValueError(f"`resample` must be one of {sorted(_MODES)} for videos; got {resample}")
    if tuple(video.shape[-2:]) == (height, width) or video.numel() == 0:
        return video
    mode = _MODES[resample]
    smooth = mode in ("bilinear", "bicubic")
    options = {"align_corners": False, "antialias": True} if smooth else {}
    if mode != "bilinear" or _native_uint8_bilinear():
        return F.interpolate(video, size=[height, width], mode=mode, **options)
    resized = F.interpolate(video.to(torch.float32), size=[height, width], mode=mode, **options)
    return resized.round_().to(torch.uint8)


def _native_uint8_bilinear() -> bool:
    """Whether torchvision resizes uint8 bilinear natively here (else through float32)."""
    capability = torch.backends.cpu.get_cpu_capability()
    return capability in ("AVX2", "AVX512") or platform.machine() in ("aarch64", "arm64")


def rescaled_and_normalized(video: torch.Tensor, settings: Qwen2VLImageSettings) -> torch.Tensor:
    """uint8 ``[F, C, H, W]`` -> float32, as the processor's fused rescale and normalize:
    ``(x - mean / s) / (std / s)`` with the statistics as float32 tensors."""
    if settings.do_normalize:
        mean = torch.tensor(settings.image_mean)
        std = torch.tensor(settings.image_std)
        if settings.do_rescale:
            mean = mean * (1.0 / settings.rescale_factor)
            std = std * (1.0 / settings.rescale_factor)
        pixels = video.to(torch.float32)
        return pixels.sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))
    if settings.do_rescale:
        return video * settings.rescale_factor
    return video.to(torch.float32)
