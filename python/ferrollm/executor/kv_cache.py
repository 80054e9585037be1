"""The paged KV cache: every layer's K and V blocks.

Per layer a K and a V tensor ``[num_blocks, block_size, num_kv_heads, head_dim]``; ``layer(i)``
gives that layer's ``(k, v)``, which is what ``ferrollm.layers.attention`` reads and writes.
A cache whose values are its keys (``KVCacheSpec.values_are_keys``: multi-head latent
attention, whose one "head" per token is the compressed latent that serves as both) holds one
tensor per layer and gives it as both ``k`` and ``v``: half the memory, and the backends'
second write of each slot stores the same values again.
Block 0 is the scheduler's null block: it pads block tables and is never allocated, so its
contents never matter.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch


@dataclass(frozen=True)
class KVCacheSpec:
    """The shape of a model's KV cache, independent of how many blocks it gets."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype
    #: One tensor per layer serves as K and V (multi-head latent attention's latent cache).
    values_are_keys: bool = False

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token's cache takes across all layers (K and V, or the one latent)."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        tensors = 1 if self.values_are_keys else 2
        return tensors * self.num_layers * self.num_kv_heads * self.head_dim * elem

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block takes across all layers, K and V."""
        return self.block_size * self.bytes_per_token

    def num_blocks_for(self, num_bytes: int) -> int:
        """How many blocks fit in ``num_bytes`` (the null block included)."""
        return num_bytes // self.bytes_per_block


class KVCache:
    """Every layer's paged K/V, allocated once (zeroed, so stale NaNs never meet a mask).

    Each layer's K and each layer's V is its own tensor, not a view of one shared buffer: the
    compiled decode step (``compiled_decode``) mutates them in place through the attention op,
    and inductor can only do that in place for tensors that alias nothing else (views of one
    buffer made it clone and copy back a layer's whole cache per step).
    """

    def __init__(self, spec: KVCacheSpec, num_blocks: int, device: torch.device) -> None:
        if num_blocks < 2:
            raise ValueError(f"`num_blocks` must be >= 2 (block 0 is reserved); got {num_blocks}")
        self.spec = spec
        self.num_blocks = num_blocks
        self.device = device
        shape = (num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
        self._layers = [
            _layer(shape, spec.dtype, device, spec.values_are_keys) for _ in range(spec.num_layers)
        ]

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self.spec.block_size

    @property
    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(k, v)`` per layer, each ``[num_blocks, block_size, num_kv_heads, head_dim]``."""
        return self._layers

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s ``(k, v)`` tensors."""
        return self._layers[i]

    def copy_blocks(self, block_copies: npt.NDArray[np.int32]) -> None:
        """Apply ``[k, 2]`` (source, destination) copies in every layer (copy-on-write forks).

        Must run before the step's forward: a forked sequence's first write goes to the new
        block, and the source block may be written by its other owner in the same step.
        Destinations are fresh blocks, never another copy's source, so one gather suffices.
        """
        if len(block_copies) == 0:
            return
        pairs = torch.from_numpy(block_copies.astype(np.int64)).to(self.device)
        for k, v in self._layers:
            k[pairs[:, 1]] = k[pairs[:, 0]]
            if v is not k:
                v[pairs[:, 1]] = v[pairs[:, 0]]


def _layer(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, values_are_keys: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    k = _zeros(shape, dtype, device)
    return (k, k) if values_are_keys else (k, _zeros(shape, dtype, device))


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed tensor; on the CPU, pages of an anonymous memory map, which the OS zero-fills
    when first touched: resident memory grows with the blocks used, not with the budget
    (``torch.zeros`` writes every page up front: 0.7 GB for the default model's float32 cache
    before the first request)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    pages = mmap.mmap(-1, nbytes)  # the tensor keeps the map alive
    return torch.frombuffer(pages, dtype=torch.uint8).view(dtype).view(shape)
