"""The CUDA platform: the same gather + SDPA paged attention, running on the GPU.

SDPA picks a fused kernel (memory-efficient attention) for the boolean masks the backend
builds; a flash-attention paged kernel can replace the backend later without touching models.
"""

from __future__ import annotations

import torch

from ferrollm.layers.attention import AttentionBackend, TorchSDPABackend
from ferrollm.platforms import Platform


def cuda_available() -> bool:
    """Whether torch sees a CUDA device."""
    return bool(torch.cuda.is_available())


class CudaPlatform(Platform):
    """One NVIDIA GPU (the current CUDA device)."""

    name = "cuda"
    dist_backend = "nccl"

    def attention_backend(self) -> AttentionBackend:
        """Plain-torch paged attention on the GPU."""
        return TorchSDPABackend()

    def synchronize(self) -> None:
        """Wait for every queued kernel on the current device."""
        torch.cuda.synchronize()

    def free_memory_bytes(self) -> int:
        """Free bytes on the current device, as the driver reports them."""
        free, _total = torch.cuda.mem_get_info()
        return int(free)
