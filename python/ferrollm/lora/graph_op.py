"""The adapters' delta as one opaque op, so a compiled decode graph serves every adapter mix.

Eager, a `LoRALinear` slices its slots to the ones the step reads (``used``) at the width of
the widest adapter loaded (``rank``): Python ints. Traced into a compiled graph, those ints
would become constants the graph guards on, and a step with another mix or a wider adapter
would recompile (tens of seconds, on the engine thread). Here the graph calls
``ferrollm::lora_delta`` instead, with the slots and the per-token mask as tensors and the two
sizes in a small int64 tensor (``LoRAState.sizes``) read when the op runs: the graph never
sees them, so it is built once for every mix of adapters and ranks.

What the graph still decides is whether a step reads any adapter at all (``LoRALinear.active``):
a base-only step skips the op, so every decode graph exists in two variants, both built at
start-up (``ferrollm.engine.build``).
"""

from __future__ import annotations

import torch

from ferrollm.lora.delta import add_delta


@torch.library.custom_op("ferrollm::lora_delta", mutates_args=())
def lora_delta(
    x: torch.Tensor,
    out: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    mask: torch.Tensor,
    sizes: torch.Tensor,
    row_slices: list[int],
) -> torch.Tensor:
    """``out`` plus each row's delta, as a new tensor: the slots ``[0, sizes[0])`` in blocks of
    ``sizes[1]`` rows; ``row_slices`` flattens the shards' ``(start, stop)`` output rows."""
    used, rank = (int(v) for v in sizes.tolist())
    slices = list(zip(row_slices[::2], row_slices[1::2], strict=True))
    return add_delta(x, out.clone(), a, b, mask, used, rank, slices)


@lora_delta.register_fake
def _(
    x: torch.Tensor,
    out: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    mask: torch.Tensor,
    sizes: torch.Tensor,
    row_slices: list[int],
) -> torch.Tensor:
    return torch.empty_like(out)
