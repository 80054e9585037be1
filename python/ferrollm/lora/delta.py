"""The masked low-rank delta every adapted projection adds (``ferrollm.lora.layers`` explains
the layout and why it is computed this way)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def add_delta(
    x: torch.Tensor,
    out: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    mask: torch.Tensor,
    used: int,
    rank: int,
    row_slices: list[tuple[int, int]],
) -> torch.Tensor:
    """``out [T, out]`` (the base product of ``x [T, in]``) plus, in place, each token's delta
    from the slot its ``mask`` row keeps: slots ``[0, used)`` of ``a`` (slot-major blocks of
    ``rank`` rows per shard) and ``b`` (``rank`` columns per slot); shard ``k`` writes the
    output rows ``row_slices[k]``."""
    num_tokens, n = x.shape[0], len(row_slices)
    h = F.linear(x.to(a.dtype), a[: used * n * rank])
    h = h.view(num_tokens, used, n, rank) * mask[:num_tokens, :used, None, None]
    b = b[:, : used * rank]
    for k, (start, stop) in enumerate(row_slices):
        h_k = h[:, :, k].reshape(num_tokens, -1)
        if out.dtype == b.dtype:
            out[:, start:stop].addmm_(h_k, b[start:stop].t())
        else:  # float32 slots over a reduced-precision base (`attach_lora`'s dtype)
            out[:, start:stop].add_(h_k @ b[start:stop].t())
    return out
