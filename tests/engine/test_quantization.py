"""Weights kept quantized: GGUF block decoding, torch's int4/int8 kernels, RTN, and quality.

Each mapping is checked against the file's own dequantized weights (gguf's reference
dequantizer), with a bound that a wrong scale, zero or nibble order would break by orders of
magnitude. The default model's quality is checked teacher-forced on 2,048 tokens of English
(the PSF license text): perplexity within 2% of the float32 dequantized model, top-1 agreement
at least 95%.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import quants

from cpu_support import AVX2_ONLY, fake_cpu
from ferrollm.config import EngineConfig, EngineConfigError
from ferrollm.engine.build import load_model
from ferrollm.executor.gguf_quant import decode_blocks
from ferrollm.executor.kv_cache import KVCacheSpec
from ferrollm.executor.loader import load_model_source
from ferrollm.executor.runner import teacher_forced_scores
from ferrollm.executor.sizing import resolve_quantization
from ferrollm.layers.linear import QUANTIZED_MAX_ROWS, Linear
from ferrollm.layers.quant import QuantizedWeight, quantize_rtn
from ferrollm.models import registry
from ferrollm.platforms import cpu_features, get_platform
from ferrollm.tokenizer import Tokenizer
from tiny_models import write_tiny_gguf

CPU = torch.device("cpu")
TEXT = Path(__file__).resolve().parents[1] / "data" / "psf_license.txt"


def random_matrix(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # Rows of different magnitudes, so a scale applied to the wrong row shows.
    return (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 1.0, (rows, 1))).astype(
        np.float32
    )


def gguf_blocks(kind: str, rows: int = 96, cols: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """A matrix quantized by gguf: its raw blocks and gguf's own dequantization of them."""
    qtype = gguf.GGMLQuantizationType[kind]
    raw = quants.quantize(random_matrix(rows, cols), qtype)
    return raw, quants.dequantize(raw, qtype)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_blocks_decode_to_exactly_the_reference_dequantization(kind: str) -> None:
    raw, reference = gguf_blocks(kind)
    decoded = decode_blocks(raw, gguf.GGMLQuantizationType[kind])
    assert decoded.source == kind
    assert decoded.bits == (8 if kind == "Q8_0" else 4)
    assert torch.equal(decoded.dequantize(), torch.from_numpy(reference))


def bf16_matmul_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """What bfloat16 rounding (of the scales, zeros and the output) can add: 2^-7 of the sum
    of the products' magnitudes."""
    return 2.0**-7 * (x.abs() @ w.abs().t()) + 1e-6


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_int4_kernel_equals_the_files_dequantized_weights(kind: str) -> None:
    raw, reference = gguf_blocks(kind)
    weight = QuantizedWeight.from_group(
        decode_blocks(raw, gguf.GGMLQuantizationType[kind]), "int4", torch.bfloat16
    )
    assert weight.scheme == "int4"
    x = torch.randn(5, reference.shape[1]).bfloat16()
    w = torch.from_numpy(reference)
    expected = x.float() @ w.t()
    error = (weight.matmul(x).float() - expected).abs()
    assert (error <= bf16_matmul_bound(x.float(), w)).all(), error.max()


def test_q8_0_runs_on_the_int8_kernel_within_its_requantization_bound() -> None:
    raw, reference = gguf_blocks("Q8_0")
    weight = QuantizedWeight.from_group(
        decode_blocks(raw, gguf.GGMLQuantizationType.Q8_0), "int8", torch.bfloat16
    )
    assert weight.scheme == "int8"
    x = torch.randn(5, reference.shape[1]).bfloat16()
    w = torch.from_numpy(reference)
    expected = x.float() @ w.t()
    # Per-channel re-quantization moves each weight by at most half a channel step.
    step = w.abs().amax(1) / 127
    bound = bf16_matmul_bound(x.float(), w) + x.float().abs().sum(1, keepdim=True) * step / 2
    error = (weight.matmul(x).float() - expected).abs()
    assert (error <= bound).all(), error.max()


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_rtn_quantization_moves_each_weight_by_at_most_half_a_step(scheme: str) -> None:
    w = torch.from_numpy(random_matrix(64, 128, seed=3))
    q = quantize_rtn(w, scheme)
    assert q.bits == (4 if scheme == "int4" else 8)
    step = q.scale.repeat_interleave(q.group_size, dim=1)
    assert ((q.dequantize() - w).abs() <= step / 2 + 1e-6).all()
    x = torch.randn(3, 128).bfloat16()
    packed = QuantizedWeight.from_group(q, scheme, torch.bfloat16)
    deq = q.dequantize()
    error = (packed.matmul(x).float() - x.float() @ deq.t()).abs()
    assert (error <= bf16_matmul_bound(x.float(), deq)).all()


def test_stacked_shards_of_differing_formats_are_requantized_to_one() -> None:
    a = quantize_rtn(torch.randn(32, 64), "int4")
    b = quantize_rtn(torch.randn(32, 64), "int8")
    layer = Linear(64, [("a", 32), ("b", 32)], bias=False, scheme="native")
    layer.compute_dtype = torch.bfloat16
    layer.load_shard("a", "weight", a)
    assert layer.quantized is None  # waits for every shard
    layer.load_shard("b", "weight", b)
    assert layer.quantized is not None and layer.quantized.scheme == "int8"
    x = torch.randn(2, 64).bfloat16()
    dense = torch.cat([a.dequantize(), b.dequantize()])
    out = layer(x).float()
    # int4's 16 levels re-quantized on 255: within one int8 step of the stacked weight.
    step = dense.abs().amax(1) / 127
    bound = bf16_matmul_bound(x.float(), dense) + x.float().abs().sum(1, keepdim=True) * step
    assert ((out - x.float() @ dense.t()).abs() <= bound).all()


def test_a_shard_of_the_wrong_shape_is_named() -> None:
    layer = Linear(64, [("q_proj", 32)], bias=False, scheme="int4")
    with pytest.raises(ValueError, match=r"q_proj\.weight.*\(16, 64\).*\(32, 64\)"):
        layer.load_shard("q_proj", "weight", quantize_rtn(torch.randn(16, 64), "int4"))


def scores(path: Path, dtype: torch.dtype, quantization: str | None, ids: np.ndarray) -> Any:
    source = load_model_source(path)
    model = load_model(source, CPU, dtype, quantization)
    c = source.config
    spec = KVCacheSpec(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 16, dtype)
    return model, teacher_forced_scores(model, ids, spec, CPU)


def linears(model: torch.nn.Module) -> list[Linear]:
    return [m for m in model.modules() if isinstance(m, Linear)]


@pytest.fixture
def no_dense_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Quantized layers run their packed kernels at every row count."""
    monkeypatch.setattr(registry, "DENSE_COPY_BUDGET", 0)


@pytest.mark.parametrize(("kind", "scheme"), [("Q4_1", "int4"), ("Q4_0", "int4"), ("Q8_0", "int8")])
def test_a_quantized_gguf_stays_quantized_and_matches_its_dequantized_model(
    tiny_model_factory: Callable[..., Path],
    tmp_path: Path,
    kind: str,
    scheme: str,
    no_dense_copies: None,
) -> None:
    path = write_tiny_gguf(tiny_model_factory("tied"), tmp_path / "t.gguf", "llama", kind)
    assert load_model_source(path).is_quantized
    ids = np.random.default_rng(0).integers(0, 300, 48)
    quantized, (lp_q, top_q) = scores(path, torch.bfloat16, "native", ids)
    _, (lp_d, top_d) = scores(path, torch.bfloat16, None, ids)
    layers = linears(quantized)
    assert len(layers) == 2 * 4 + 1  # qkv, o, gate_up, down per layer, and the tied head
    assert all(layer.weight is None and layer.quantized is not None for layer in layers)
    assert not any(p.dtype == torch.float32 and p.dim() == 2 for p in quantized.parameters())
    assert {layer.quantized.scheme for layer in layers if layer.quantized} == {scheme}
    assert quantized.model.embed_tokens.weight is None  # rows looked up from the blocks
    # Logits come out in bfloat16 (8 bits of mantissa): compare relative to their size.
    assert ((lp_q - lp_d).abs() <= 0.02 * lp_d.abs() + 0.05).all()
    assert (top_q == top_d).float().mean() >= 0.9


def test_small_models_keep_a_dense_copy_for_many_rows(
    tiny_model_factory: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_tiny_gguf(tiny_model_factory("tied"), tmp_path / "t.gguf", "llama", "Q4_1")
    with monkeypatch.context() as patch:  # an AVX2-only CPU: the copy as a plain weight
        fake_cpu(patch, *AVX2_ONLY)
        plain = load_model(load_model_source(path), CPU, torch.bfloat16, "native")
    plain_layer = plain.model.layers[0].mlp.gate_up_proj
    assert plain_layer.quantized is not None and plain_layer.weight is not None
    assert plain_layer.weight.dtype == torch.bfloat16
    many = torch.randn(QUANTIZED_MAX_ROWS + 1, plain_layer.in_features).bfloat16()
    assert torch.equal(plain_layer(many), F.linear(many, plain_layer.weight))
    few = many[:QUANTIZED_MAX_ROWS]
    assert torch.equal(plain_layer(few), plain_layer.quantized.matmul(few))
    # The copy is the packed weight's own dequantization: the two paths agree.
    assert (
        (plain_layer(few).float() - F.linear(few, plain_layer.weight).float()).abs() < 0.05
    ).all()

    # On the host, the copy is reordered for oneDNN where torch has it (x86 wheels do) and the
    # CPU runs its bfloat16 kernels, in place of the plain one (same memory), and gives the
    # plain copy's results.
    model = load_model(load_model_source(path), CPU, torch.bfloat16, "native")
    layer = model.model.layers[0].mlp.gate_up_proj
    has_onednn = (
        torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and cpu_features.cpu_caps().onednn_bf16
    )
    assert (layer.packed is not None) == has_onednn
    assert (layer.weight is None) == has_onednn
    torch.testing.assert_close(layer(many), plain_layer(many))
    assert torch.equal(layer(few), plain_layer(few))


def test_other_gguf_types_are_requantized_to_the_nearest_kernel(
    tiny_model_factory: Callable[..., Path], tmp_path: Path
) -> None:
    path = write_tiny_gguf(tiny_model_factory("tied"), tmp_path / "t.gguf", "llama", "Q5_0")
    model = load_model(load_model_source(path), CPU, torch.bfloat16, "native")
    # Q5_0 (5.5 bits a weight) has no kernel: int8 keeps more than it had.
    assert {layer.quantized.scheme for layer in linears(model) if layer.quantized} == {"int8"}


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_hf_checkpoint_quantized_at_load(
    tiny_model_factory: Callable[..., Path], scheme: str, no_dense_copies: None
) -> None:
    path = tiny_model_factory("llama-bias")  # biases added after the quantized matmul
    ids = np.random.default_rng(1).integers(0, 300, 48)
    model, (lp_q, _) = scores(path, torch.bfloat16, scheme, ids)
    _, (lp_d, _) = scores(path, torch.bfloat16, None, ids)
    layers = linears(model)
    assert layers and all(layer.quantized and layer.quantized.scheme == scheme for layer in layers)
    tolerance = 0.1 if scheme == "int4" else 0.02
    assert ((lp_q - lp_d).abs() <= tolerance * lp_d.abs() + 0.05).all()


def test_quantization_needs_bfloat16_on_cpu() -> None:
    cpu = get_platform("cpu")
    with pytest.raises(EngineConfigError, match=r"`quantization` int4 .*bfloat16") as err:
        resolve_quantization(cpu, "int4", torch.float32, source_is_quantized=False)
    assert err.value.field == "quantization"
    assert resolve_quantization(cpu, "auto", torch.float32, source_is_quantized=True) is None
    assert resolve_quantization(cpu, "auto", torch.bfloat16, source_is_quantized=True) == "native"
    assert resolve_quantization(cpu, "auto", torch.bfloat16, source_is_quantized=False) is None
    assert resolve_quantization(cpu, "none", torch.bfloat16, source_is_quantized=True) is None
    with pytest.raises(EngineConfigError, match="`quantization` must be one of") as bad:
        EngineConfig(quantization="int3")
    assert bad.value.field == "quantization"
    with pytest.raises(EngineConfigError, match="`kv_cache_dtype` must be one of") as bad_kv:
        EngineConfig(kv_cache_dtype="int8")
    assert bad_kv.value.field == "kv_cache_dtype"


@pytest.mark.parametrize("dense_copies", [False, True], ids=["kernels", "dense-copies"])
def test_default_model_quality_quantized_vs_float32(
    smollm2_gguf: Path, monkeypatch: pytest.MonkeyPatch, dense_copies: bool
) -> None:
    """Measured (2,048 tokens): float32 perplexity 7.810; packed kernels 7.809 with 96.7%
    top-1 agreement; bfloat16 dense copies 7.837 with 98.1%. (An int4 LM head instead of
    the int8 one measured 8.129 and 89.5%: why the Q8_0 head stays 8-bit.)"""
    if not dense_copies:
        monkeypatch.setattr(registry, "DENSE_COPY_BUDGET", 0)
    source = load_model_source(smollm2_gguf)
    ids = np.asarray(Tokenizer.from_source(source).encode(TEXT.read_text())[:2048])
    assert len(ids) == 2048
    _, (lp_ref, top_ref) = scores(smollm2_gguf, torch.float32, None, ids)
    _, (lp_q, top_q) = scores(smollm2_gguf, torch.bfloat16, "native", ids)
    ppl_ref, ppl_q = (-lp_ref.mean()).exp().item(), (-lp_q.mean()).exp().item()
    agreement = (top_q == top_ref).float().mean().item()
    assert abs(ppl_q / ppl_ref - 1) <= 0.02, (ppl_ref, ppl_q)
    assert agreement >= 0.95, agreement
