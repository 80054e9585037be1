"""The one device layer: which device runs the model, and how attention, memory and sync work there.

``torch.cuda`` and ``torch_npu`` appear only in this package (ruff's banned-api rule enforces it).
The device is detected once per process, NPU first (when ``torch_npu`` imports and sees a
device), then CUDA, then CPU; an explicit ``device`` ("cpu", "cuda" or "npu") overrides it and
fails clearly when that device is not there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cache
from typing import ClassVar

import torch

from ferrollm.config import DEVICE_NAMES
from ferrollm.layers.attention import AttentionBackend

__all__ = [
    "DEVICE_NAMES",
    "MemoryInfo",
    "Platform",
    "current_platform",
    "detect_device",
    "get_platform",
]


@dataclass(frozen=True)
class MemoryInfo:
    """Device memory in bytes: ``free`` now, and the ``total``."""

    free: int
    total: int


class Platform(ABC):
    """A kind of device: its torch device, attention backend and memory/sync primitives."""

    #: ``device`` name: "cpu", "cuda" or "npu".
    name: ClassVar[str]
    #: torch.distributed backend for tensor parallelism: "gloo", "nccl" or "hccl".
    dist_backend: ClassVar[str]
    #: Whether this is an accelerator (bfloat16 by default, KV cache sized from free memory).
    is_accelerator: ClassVar[bool]
    #: What ``dtype="auto"`` resolves to (see ``ferrollm.executor.sizing.resolve_dtype``).
    preferred_dtype: ClassVar[torch.dtype]
    #: Model/KV-cache dtypes the device's kernels run.
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (
        torch.float32,
        torch.bfloat16,
        torch.float16,
    )

    @classmethod
    @abstractmethod
    def available(cls) -> bool:
        """Whether this process can use the device (never raises)."""

    @property
    def device(self) -> torch.device:
        """The torch device models and KV caches live on."""
        return torch.device(self.name)

    @abstractmethod
    def attention_backend(self) -> AttentionBackend:
        """The paged-attention implementation for this device."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for queued device work (a no-op on CPU)."""

    @abstractmethod
    def memory_info(self) -> MemoryInfo:
        """Free and total bytes of the memory the KV cache would live in."""

    def check_block_size(self, block_size: int) -> None:  # noqa: B027 (most devices take any)
        """Raise ValueError if this device's attention kernel cannot use ``block_size``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.name!r})"


def _platform_classes() -> dict[str, type[Platform]]:
    # Imported here: each module imports this one for `Platform`.
    from ferrollm.platforms.cpu import CpuPlatform
    from ferrollm.platforms.cuda import CudaPlatform
    from ferrollm.platforms.npu import NpuPlatform

    return {"npu": NpuPlatform, "cuda": CudaPlatform, "cpu": CpuPlatform}


def detect_device() -> str:
    """The first available device name in ``DEVICE_NAMES`` order ("cpu" always is)."""
    classes = _platform_classes()
    return next(name for name in DEVICE_NAMES if classes[name].available())


def get_platform(device: str | None = None) -> Platform:
    """The platform for ``device`` ("cpu", "cuda" or "npu"), or the detected one when None.

    Raises ValueError naming ``device`` for an unknown name or a device this process lacks.
    """
    if device is None:
        return current_platform()
    classes = _platform_classes()
    if device not in classes:
        raise ValueError(f"`device` must be one of {', '.join(DEVICE_NAMES)}; got {device!r}")
    cls = classes[device]
    if not cls.available():
        raise ValueError(
            f"`device` is {device!r} but no {device} device is available here "
            f"(detected: {detect_device()!r}); leave `device` unset to use the detected one"
        )
    return cls()


@cache
def current_platform() -> Platform:
    """The detected platform, decided once per process."""
    return _platform_classes()[detect_device()]()
