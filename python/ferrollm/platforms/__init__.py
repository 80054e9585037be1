"""The one device layer: each platform says which device to use and how to run attention on it.

``torch.cuda`` and ``torch_npu`` appear only in this package (a lint rule enforces it). Detection
order is NPU (later), then CUDA, then CPU; ``get_platform(name)`` overrides it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import cache

import torch

from ferrollm.layers.attention import AttentionBackend


class Platform(ABC):
    """A kind of device: its torch device, attention backend and memory/sync primitives."""

    #: ``--device`` name: "cpu", "cuda" or "npu".
    name: str
    #: torch.distributed backend for tensor parallelism on this device.
    dist_backend: str

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
    def free_memory_bytes(self) -> int:
        """Bytes free on the device now (for sizing the KV cache)."""


def get_platform(name: str | None = None) -> Platform:
    """The platform called ``name``, or the detected one when None."""
    from ferrollm.platforms.cpu import CpuPlatform
    from ferrollm.platforms.cuda import CudaPlatform, cuda_available

    if name is None:
        name = "cuda" if cuda_available() else "cpu"
    platforms: dict[str, type[Platform]] = {"cpu": CpuPlatform, "cuda": CudaPlatform}
    if name not in platforms:
        raise ValueError(f"`device` must be one of {', '.join(platforms)}; got {name!r}")
    return platforms[name]()


@cache
def current_platform() -> Platform:
    """The detected platform, decided once per process."""
    return get_platform()
