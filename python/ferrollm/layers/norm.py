"""RMSNorm, computed in float32 like the reference implementations (Llama, Qwen, Mistral)."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension, with a learned scale.

    The statistics are computed in float32 and the result is cast back before the scale is
    applied, which is what Hugging Face does: greedy parity in bfloat16 depends on that order.
    """

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize ``x [..., size]``; returns the same shape and dtype."""
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class OffsetRMSNorm(RMSNorm):
    """Gemma's RMSNorm: the scale is ``1 + weight`` (checkpoints store the offset from one) and
    it is applied in float32 before the cast back, the order transformers' Gemma uses."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__(size, eps)
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize ``x [..., size]``; returns the same shape and dtype."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)
