"""The tensor-parallel layers: row-parallel linear and vocab-parallel embedding.

Column-parallel layers need no class of their own: a rank's `Linear` simply has fewer output
rows (its heads, its slice of gate and of up), loaded from the rows the `ShardPlan` reads.
Row-parallel layers (o_proj, down_proj) hold a slice of the input columns; each rank's partial
product is summed with one all-reduce, and the bias is added once, after it; so is a LoRA
adapter's partial delta (``ferrollm.lora.layers``), added before the reduce. The token table is
split by vocabulary rows: a rank embeds the ids in its range, zeros elsewhere, and the
all-reduce gives every rank the full rows. The unsharded model never builds these classes,
so a single-device run keeps its fused ``linear`` (bias in the same call) untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ferrollm.distributed.collectives import all_reduce
from ferrollm.distributed.state import ParallelState
from ferrollm.layers.linear import Embedding, Linear, Weight


class RowParallelLinear(Linear):
    """``y = all_reduce(x_r @ W_r.T) + b``: this rank holds input columns ``W_r``."""

    def __init__(
        self,
        in_features: int,
        shards: Sequence[tuple[str, int]],
        *,
        bias: bool,
        scheme: str | None,
        parallel: ParallelState,
    ) -> None:
        super().__init__(in_features, shards, bias=bias, scheme=scheme)
        self.parallel = parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, in_r]`` (this rank's columns) -> the full ``[T, out]`` on every rank."""
        out = self.product(x, None)
        if self.lora is not None:  # this rank's share of the delta, summed by the reduce
            out = self.lora.add(x, out)
        all_reduce(out, self.parallel)
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(Embedding):
    """Rows ``[start, start + num_embeddings)`` of the token table (the tail past the real
    vocabulary is zero padding)."""

    def __init__(
        self, num_embeddings: int, dim: int, *, quantized: bool, start: int, parallel: ParallelState
    ) -> None:
        super().__init__(num_embeddings, dim, quantized=quantized)
        self.start = start
        self.parallel = parallel

    def load(self, tensor: Weight) -> None:
        """Fill the table from this rank's checkpoint rows (padded with zero rows)."""
        super().load(pad_rows(tensor, self.num_embeddings))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids [T]`` (full vocabulary) -> ``[T, dim]``, identical on every rank."""
        local = ids - self.start
        outside = (local < 0) | (local >= self.num_embeddings)
        rows = super().forward(local.masked_fill(outside, 0))
        rows = rows.masked_fill(outside[:, None], 0.0)
        return all_reduce(rows, self.parallel)


def pad_rows(tensor: Weight, num_rows: int) -> Weight:
    """``tensor`` with zero rows appended up to ``num_rows`` (quantized ones too: zero bytes
    are a zero scale and zero values)."""
    missing = num_rows - tensor.shape[0]
    if missing <= 0:
        return tensor
    if isinstance(tensor, torch.Tensor):
        return torch.cat([tensor, tensor.new_zeros((missing, *tensor.shape[1:]))])
    return tensor.pad_rows(num_rows)
