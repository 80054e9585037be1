"""A linear layer whose output stacks several checkpoint projections (q/k/v, gate/up).

One matmul instead of three (or two) per layer: on CPU at small batch the per-call overhead of
separate projections is a real share of the step, and on accelerators fewer, larger GEMMs run
closer to peak.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class MergedLinear(nn.Linear):
    """``nn.Linear`` whose output rows are the named shards, in order.

    ``shards`` maps each checkpoint projection (``"q"``, ``"k"``, ``"v"``) to its output size;
    ``load_shard`` copies one checkpoint tensor into its rows.
    """

    def __init__(self, in_features: int, shards: Sequence[tuple[str, int]], *, bias: bool) -> None:
        super().__init__(in_features, sum(size for _, size in shards), bias=bias)
        self.shard_slices: dict[str, slice] = {}
        start = 0
        for name, size in shards:
            self.shard_slices[name] = slice(start, start + size)
            start += size

    def load_shard(self, shard: str, kind: str, tensor: torch.Tensor) -> None:
        """Copy checkpoint ``tensor`` into shard ``shard``'s rows of ``kind`` (weight or bias)."""
        param = self.weight if kind == "weight" else self.bias
        if param is None:
            raise ValueError(f"checkpoint has a {shard} bias but the layer was built without one")
        target = param.data[self.shard_slices[shard]]
        copy_checked(target, tensor, f"{shard}.{kind}")


def copy_checked(target: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
    """``target.copy_(tensor)`` after checking shapes, naming the tensor when they differ."""
    if tuple(target.shape) != tuple(tensor.shape):
        raise ValueError(
            f"checkpoint tensor `{name}` has shape {tuple(tensor.shape)}; "
            f"the model expects {tuple(target.shape)}"
        )
    target.copy_(tensor)
