"""Llama's SwiGLU feed-forward on block weights as one kernel call.

``down(silu(gate(x)) * up(x))`` is two block-kernel products and two elementwise ops between
them; at one row a decode step pays each call's fixed cost (the dispatcher, the activations'
quantization, a parallel region) on every layer. `fused_silu_mlp` runs the whole block as
``_core._GgmlWeight.silu_mlp`` where both projections are plain block weights in float32 (no
bias, no adapter, no shard of a tensor-parallel group, no dense copy for this row count), on
steps of at most ``QUANTIZED_MAX_ROWS`` rows, and says None elsewhere so the caller runs the
layers as they are.

``benches/linear.py --shapes mlp --m 1 2 4 8 32 --threads 2 --repeats 200`` (the default
model's feed-forward on q4_1 blocks, best of 200; AMD EPYC, 2 CPUs, avx512_vnni): fused against
the parts, 1.23x at one row, 1.21x at 2, 1.12x at 4, 1.04x at 8 and 0.98x at 32 (the gating
runs a row per job). Hence the row cap, which is a split the compiled decode graphs already
have (no extra graph).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ferrollm.layers.linear import QUANTIZED_MAX_ROWS, Linear


def fused_silu_mlp(
    gate_up: torch.nn.Module,
    down: torch.nn.Module,
    act: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
) -> torch.Tensor | None:
    """``down(act(gate) * up)`` of ``x [T, hidden]`` in one call (``gate_up``'s rows gate's
    then up's), or None where the fused kernel does not apply."""
    if act is not F.silu or x.dtype != torch.float32 or len(x) > QUANTIZED_MAX_ROWS:
        return None
    if type(gate_up) is not Linear or type(down) is not Linear:
        return None
    stacked, projection = gate_up.block_weight(x), down.block_weight(x)
    if stacked is None or projection is None:
        return None
    return stacked.silu_mlp(x, projection)
