"""The one device layer: which device runs the model, and how attention, memory and sync work there.

``torch.cuda`` and ``torch_npu`` appear only in this package (ruff's banned-api rule enforces it).
The device is detected once per process, NPU first (when ``torch_npu`` imports and sees a
device), then CUDA, then CPU; an explicit ``device`` ("cpu", "cuda" or "npu") overrides it and
fails clearly when that device is not there.
"""

from __future__ import annotations

from functools import cache

from ferrollm.devices import DEVICE_NAMES
from ferrollm.platforms.base import MemoryInfo, Platform
from ferrollm.platforms.cpu import CpuPlatform
from ferrollm.platforms.cuda import CudaPlatform
from ferrollm.platforms.npu import NpuPlatform

__all__ = [
    "DEVICE_NAMES",
    "MemoryInfo",
    "Platform",
    "current_platform",
    "detect_device",
    "get_platform",
]


_PLATFORM_CLASSES: dict[str, type[Platform]] = {
    "npu": NpuPlatform,
    "cuda": CudaPlatform,
    "cpu": CpuPlatform,
}


def detect_device() -> str:
    """The first available device name in ``DEVICE_NAMES`` order ("cpu" always is)."""
    return next(name for name in DEVICE_NAMES if _PLATFORM_CLASSES[name].available())


def get_platform(device: str | None = None) -> Platform:
    """The platform for ``device`` ("cpu", "cuda" or "npu"), or the detected one when None.

    Raises ValueError naming ``device`` for an unknown name or a device this process lacks.
    """
    if device is None:
        return current_platform()
    if device not in _PLATFORM_CLASSES:
        raise ValueError(f"`device` must be one of {', '.join(DEVICE_NAMES)}; got {device!r}")
    cls = _PLATFORM_CLASSES[device]
    if not cls.available():
        raise ValueError(
            f"`device` is {device!r} but no {device} device is available here "
            f"(detected: {detect_device()!r}); leave `device` unset to use the detected one"
        )
    return cls()


@cache
def current_platform() -> Platform:
    """The detected platform, decided once per process."""
    return _PLATFORM_CLASSES[detect_device()]()
