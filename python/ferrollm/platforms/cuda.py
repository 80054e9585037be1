"""The CUDA platform: the same gather + SDPA paged attention, running on the GPU.

SDPA picks a fused kernel (memory-efficient attention) for the boolean masks the backend
builds; a flash-attention paged kernel can replace the backend later without touching models.
"""

from __future__ import annotations

import torch

from ferrollm.layers.attention import AttentionBackend, TorchSDPABackend
from ferrollm.platforms.base import MemoryInfo, Platform


class CudaPlatform(Platform):
    """One NVIDIA GPU (the current CUDA device; pick another with CUDA_VISIBLE_DEVICES)."""

    name = "cuda"
    dist_backend = "nccl"
    is_accelerator = True
    preferred_dtype = torch.bfloat16

    @classmethod
    def available(cls) -> bool:
        """Whether torch sees a CUDA device."""
        return bool(torch.cuda.is_available())

    def attention_backend(self) -> AttentionBackend:
        """Plain-torch paged attention on the GPU."""
        return TorchSDPABackend()

    def set_device(self, index: int) -> None:
        """``torch.cuda.set_device`` (NOT RUN with more than one GPU: none was available)."""
        torch.cuda.set_device(index)

    def synchronize(self) -> None:
        """Wait for every queued kernel on the current device."""
        torch.cuda.synchronize()

    def memory_info(self) -> MemoryInfo:
        """Free and total bytes of the current device, as the driver reports them.

        Memory the caching allocator holds (say, after a profiling pass) counts as used.
        """
        free, total = torch.cuda.mem_get_info()
        return MemoryInfo(free=int(free), total=int(total))
