"""Which slice of each checkpoint tensor this rank reads: the seam between model and loader.

The model knows how it is sharded; the checkpoint format knows how to read part of a tensor.
A `ShardPlan` maps transformers tensor names to one contiguous `TensorSlice` along one dim,
and every `ModelSource.iter_weights` honours it (safetensors by slicing, GGUF by reading only
the rows' or columns' blocks), so no format special-cases live in the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TensorSlice:
    """Indices ``[start, stop)`` along ``dim`` (0: output rows, 1: input columns)."""

    dim: int
    start: int
    stop: int

    def __post_init__(self) -> None:
        if self.dim not in (0, 1) or not 0 <= self.start <= self.stop:
            raise ValueError(f"invalid tensor slice {self}")

    @property
    def size(self) -> int:
        """Indices in the slice."""
        return self.stop - self.start


@dataclass(frozen=True)
class ShardPlan:
    """Rank ``rank`` of ``world_size``: the slice of each named tensor it reads; a tensor not
    named is read whole."""

    rank: int = 0
    world_size: int = 1
    slices: Mapping[str, TensorSlice] = field(default_factory=dict)

    def slice_of(self, name: str) -> TensorSlice | None:
        """The slice of tensor ``name`` to read, or None for all of it."""
        return self.slices.get(name)

    def refusal(self, name: str, why: str) -> ValueError:
        """The error for a tensor this plan cannot be read as: names the tensor and the rule."""
        return ValueError(f"`tensor_parallel_size` {self.world_size} cannot split `{name}`: {why}")


#: Every tensor whole.
WHOLE = ShardPlan()
