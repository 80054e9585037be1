"""`Platform`, the interface every device implements, and `MemoryInfo`.

Apart from the package's ``__init__`` so that the device modules (``cpu``, ``cuda``, ``npu``)
import the interface from here while ``__init__`` imports them: no module of the package imports
one that imports it back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from ferrollm.layers.attention import AttentionBackend

if TYPE_CHECKING:
    from ferrollm.executor.kv_cache import KVCache
    from ferrollm.executor.runner import CausalLM, DecodeGraphs


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

    def auto_dtype(self) -> torch.dtype:
        """What ``dtype="auto"`` resolves to; ``preferred_dtype`` unless the device says more."""
        return self.preferred_dtype

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

    def decode_graphs(
        self,
        mode: str,
        model: CausalLM,
        kv_cache: KVCache,
        backend: AttentionBackend,
        max_model_len: int,
        max_num_seqs: int,
    ) -> DecodeGraphs | None:
        """Device graphs of the decode step as ``mode`` (``EngineConfig.compile``) asks, built
        and warmed up, or None where this device has none (the CPU's compiled decode is built
        apart, in ``ferrollm.executor.compiled_decode``)."""
        return None

    def set_device(self, index: int) -> None:  # noqa: B027 (the CPU has one "device")
        """Make device ``index`` the current one (a tensor-parallel rank's own device), so
        that ``device`` means it."""

    def check_dtype(self, dtype: torch.dtype, field: str) -> None:  # noqa: B027 (most run any)
        """Raise EngineConfigError naming ``field`` if ``dtype`` cannot run on this machine's
        hardware (beyond ``supported_dtypes``), or log what running it there costs."""

    def check_block_size(self, block_size: int) -> None:  # noqa: B027 (most devices take any)
        """Raise ValueError if this device's attention kernel cannot use ``block_size``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.name!r})"
