"""Phi-3 and GLM-4 GGUF files as llama.cpp's converter writes them. Phi-3: fused q/k/v and
gate/up tensors, long-rope factors as tensors, partial rotary and the window as keys; GLM-4:
fused gate/up, post-block norms, partial rotary. (The tiny "phi3" and "glm4" families also run
through test_loader_gguf's sweep: config fields and weights equal to their HF checkpoints'.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ferrollm import LLM, SamplingParams
from ferrollm.executor.loader import load_model_source
from tiny_gguf import write_tiny_gguf
from tiny_models import build_tiny_model

PROMPTS = ["Hello world", "def f(x): return", "0123 hello, world"]


def test_phi3_gguf_without_long_rope_keeps_its_window(tmp_path: Path) -> None:
    # Phi-3-mini-4k's shape: a sliding window and plain rope over whole heads.
    sizes = {"sliding_window": 7, "partial_rotary_factor": 1.0, "rope_scaling": None}
    hf_dir = build_tiny_model("phi3", tmp_path / "hf", sizes=sizes)
    hf = load_model_source(hf_dir)
    source = load_model_source(write_tiny_gguf(hf_dir, tmp_path / "t.gguf", "phi3"))
    assert hf.config.sliding_window == source.config.sliding_window == 7
    assert hf.config.rope_scaling is None and source.config.rope_scaling is None
    assert source.config.partial_rotary_factor == 1.0


def test_phi3_gguf_long_rope_is_the_hf_one(
    tiny_model_factory: Callable[..., Path], tiny_gguf_factory: Callable[[str], Path]
) -> None:
    ours = load_model_source(tiny_gguf_factory("phi3")).config
    theirs = load_model_source(tiny_model_factory("phi3")).config
    assert ours.rope_scaling is not None and ours.rope_scaling.rope_type == "longrope"
    assert ours.rope_scaling.long_factor == (1.0, 2.0, 4.0, 8.0, 12.0, 16.0)
    assert ours.rope_scaling == theirs.rope_scaling
    assert ours.partial_rotary_factor == 0.75
    assert ours.sliding_window is None  # written as 0


@pytest.mark.parametrize("family", ["phi3", "glm4"])
def test_a_q8_0_gguf_keeps_its_fused_layers_quantized_and_its_greedy_tokens(
    family: str,
    tiny_model_factory: Callable[..., Path],
    tiny_gguf_factory: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    quantized_path = tmp_path / "q8.gguf"
    write_tiny_gguf(tiny_model_factory(family), quantized_path, family, "Q8_0")
    options = {"dtype": "float32", "max_num_seqs": 4, "kv_cache_memory": "4MiB"}
    quantized, dense = LLM(quantized_path, **options), LLM(tiny_gguf_factory(family), **options)
    layer = quantized.engine.runner.model.model.layers[0]  # type: ignore[attr-defined]
    for fused in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj):
        assert fused.quantized is not None and fused.quantized.scheme == "Q8_0"
        assert fused.weight is None or fused.weight.dtype != torch.float32
    # A few tokens: the random tiny model has near-ties that Q8_0's rounding flips later on.
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    ours, theirs = quantized.generate(PROMPTS, params), dense.generate(PROMPTS, params)
    for a, b in zip(ours, theirs, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids


@pytest.mark.parametrize("missing", ["rope_factors_long.weight", "rope_factors_short.weight"])
def test_phi3_long_rope_needs_both_factor_tensors(missing: str) -> None:
    from ferrollm.executor.gguf_phi3 import ROPE_FACTOR_TENSORS, phi3_fields

    meta = {"phi3.context_length": 512, "phi3.embedding_length": 64}
    meta |= {"phi3.attention.head_count": 4, "phi3.rope.dimension_count": 12}
    factors = {key: [1.0] * 6 for name, key in ROPE_FACTOR_TENSORS.items() if name != missing}
    with pytest.raises(ValueError, match="needs both"):
        phi3_fields(meta, factors)
