"""The two collectives the sharded model needs, each a no-op in a group of one.

Both are collective: every rank of ``parallel.group`` must call them in the same order with
tensors of the same shape, or the group hangs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ferrollm.distributed.state import ParallelState


def all_reduce(x: torch.Tensor, parallel: ParallelState) -> torch.Tensor:
    """Sum ``x`` over the group, in place; returns ``x`` (untouched when alone)."""
    if parallel.world_size > 1:
        dist.all_reduce(x, group=parallel.group)
    return x


def gather_to_driver(x: torch.Tensor, parallel: ParallelState) -> torch.Tensor:
    """Every rank's ``x [..., n]`` concatenated along the last dim on rank 0 (rank order);
    other ranks get their own ``x`` back."""
    if parallel.world_size == 1:
        return x
    x = x.contiguous()
    parts = (
        [torch.empty_like(x) for _ in range(parallel.world_size)] if parallel.is_driver else None
    )
    dist.gather(x, parts, group=parallel.group, group_dst=0)
    return x if parts is None else torch.cat(parts, dim=-1)
