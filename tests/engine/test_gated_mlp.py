"""The fused SwiGLU feed-forward on block weights (``ferrollm.layers.gated_mlp``): the same
product as its parts on every kernel path, taken only where the parts would run on block
kernels, refused with the field named otherwise."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_quantization import blocks_of, random_blocks

from ferrollm.layers.gated_mlp import fused_silu_mlp
from ferrollm.layers.ggml_linear import GgmlWeight, kernel_paths
from ferrollm.layers.linear import QUANTIZED_MAX_ROWS, Linear

HIDDEN, INNER = 96, 256  # K = 96 is no multiple of 256; the K-quant down needs 256


def parts(gate_up: GgmlWeight, down: GgmlWeight, x: torch.Tensor, path: str) -> torch.Tensor:
    gate, up = gate_up.matmul_on(x, path).chunk(2, dim=-1)
    return down.matmul_on(F.silu(gate) * up, path)


@pytest.mark.parametrize("path", kernel_paths())
def test_the_fused_feed_forward_equals_its_parts_on_every_path(path: str) -> None:
    """Gate and up of different types (their own columns), a K-quant down; ragged rows. The two
    differ only where SiLU's last bit moves a gated value across an int8 rounding step."""
    gate_up = GgmlWeight(
        [
            blocks_of("Q4_1", random_blocks("Q4_1", INNER, HIDDEN, seed=1)),
            blocks_of("Q8_0", random_blocks("Q8_0", INNER, HIDDEN, seed=2)),
        ]
    )
    down = GgmlWeight([blocks_of("Q4_K", random_blocks("Q4_K", HIDDEN, INNER, seed=3))])
    for m in (1, 3, 17):
        x = torch.randn(m, HIDDEN, generator=torch.Generator().manual_seed(m)) * 2
        fused = gate_up._weight.silu_mlp(x, down._weight, path)
        want = parts(gate_up, down, x, path)
        assert fused.shape == (m, HIDDEN) and fused.dtype == torch.float32
        assert (fused - want).abs().max() <= 1e-3 * want.abs().max() + 1e-6, (m, path)


def linears(bias: bool = False) -> tuple[Linear, Linear]:
    gen = torch.Generator().manual_seed(5)
    gate_up = Linear(HIDDEN, [("gate_proj", INNER), ("up_proj", INNER)], bias=bias, scheme="int4")
    for shard in ("gate_proj", "up_proj"):
        gate_up.load_shard(shard, "weight", torch.randn(INNER, HIDDEN, generator=gen) * 0.05)
    down = Linear(INNER, [("down_proj", HIDDEN)], bias=False, scheme="int4")
    down.load_shard("down_proj", "weight", torch.randn(HIDDEN, INNER, generator=gen) * 0.05)
    return gate_up, down


def test_the_fused_call_runs_where_the_layers_would_run_block_kernels() -> None:
    gate_up, down = linears()
    for m in (1, QUANTIZED_MAX_ROWS):
        x = torch.randn(m, HIDDEN, generator=torch.Generator().manual_seed(m))
        gate, up = gate_up(x).chunk(2, dim=-1)
        want = down(F.silu(gate) * up)
        fused = fused_silu_mlp(gate_up, down, F.silu, x)
        assert fused is not None
        assert (fused - want).abs().max() <= 1e-3 * want.abs().max() + 1e-6
    x = torch.randn(1, HIDDEN)
    # Past the row cap, another activation, bfloat16 activations: the caller runs the parts.
    assert (
        fused_silu_mlp(gate_up, down, F.silu, torch.randn(QUANTIZED_MAX_ROWS + 1, HIDDEN)) is None
    )
    assert fused_silu_mlp(gate_up, down, F.gelu, x) is None
    assert fused_silu_mlp(gate_up, down, F.silu, x.bfloat16()) is None
    # A bias after the product: not fused.
    biased, _ = linears(bias=True)
    assert fused_silu_mlp(biased, down, F.silu, x) is None


def test_bad_inputs_are_refused_naming_the_field() -> None:
    gate_up, down = linears()
    assert gate_up.quantized is not None and down.quantized is not None
    with pytest.raises(ValueError, match="`x`"):
        gate_up.quantized.silu_mlp(torch.randn(1, HIDDEN).bfloat16(), down.quantized)
    with pytest.raises(ValueError, match="`down`"):
        # down's K must be half of gate_up's rows: gate_up as its own down is not.
        gate_up.quantized._weight.silu_mlp(torch.randn(1, HIDDEN), gate_up.quantized._weight)


def test_strided_activations_give_the_contiguous_products() -> None:
    """A strided ``x`` is copied to a contiguous tensor the kernels read while they run: the
    same products, bit for bit, as from a contiguous ``x``."""
    gate_up, down = linears()
    assert gate_up.quantized is not None and down.quantized is not None
    wide = torch.randn(3, 2 * HIDDEN, generator=torch.Generator().manual_seed(9))
    strided = wide[:, ::2]
    assert not strided.is_contiguous()
    dense = strided.contiguous()
    fused, matmul = gate_up.quantized._weight.silu_mlp, gate_up.quantized._weight.matmul
    assert torch.equal(fused(strided, down.quantized._weight), fused(dense, down.quantized._weight))
    assert torch.equal(matmul(strided), matmul(dense))
