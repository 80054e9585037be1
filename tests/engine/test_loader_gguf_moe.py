"""GGUF mixture-of-experts files (llama.cpp's stacked expert tensors) against their Hugging
Face checkpoints: Mixtral, Qwen2-MoE (shared expert, a dense layer), Qwen3-MoE."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_loader_gguf import assert_same_config, assert_same_weights

from ferrollm.executor.gguf_config import hf_config_from_gguf
from ferrollm.executor.loader import load_model_source
from tiny_gguf import write_tiny_gguf

MOE_GGUF_FAMILIES = ["mixtral", "qwen2-moe", "qwen3-moe"]
_MIXTRAL_NAME = re.compile(r"\.block_sparse_moe\.(?:experts\.(\d+)\.(w[123])|(gate))\.")
_MIXTRAL_PROJ = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}


def per_expert_name(name: str) -> str:
    """Mixtral's on-disk name of a tensor as transformers 5 names it (Qwen's are already)."""

    def rename(m: re.Match[str]) -> str:
        return ".mlp.gate." if m[3] else f".mlp.experts.{m[1]}.{_MIXTRAL_PROJ[m[2]]}."

    return _MIXTRAL_NAME.sub(rename, name)


@pytest.mark.parametrize("family", MOE_GGUF_FAMILIES)
def test_tiny_moe_gguf_loads_as_its_hf_checkpoint(
    family: str,
    tiny_model_factory: Callable[..., Path],
    tiny_gguf_factory: Callable[[str], Path],
) -> None:
    # Each expert's slice of the stacked tensors, the routers, Qwen2-MoE's shared expert and
    # its dense layer 0 (no router in the file), Mixtral's permuted q/k: all exact.
    hf_source = load_model_source(tiny_model_factory(family))
    gguf_source = load_model_source(tiny_gguf_factory(family))
    ours, theirs = gguf_source.config, hf_source.config
    assert (ours.architecture, ours.model_type) == (theirs.architecture, theirs.model_type)
    assert ours.moe is not None and ours.moe == theirs.moe
    assert_same_config(ours, theirs)
    expected_weights = {per_expert_name(k): v for k, v in hf_source.iter_weights(torch.float32)}
    assert_same_weights(gguf_source.iter_weights(torch.float32), expected_weights, tied=False)


def test_gguf_moe_routing_follows_the_architecture() -> None:
    # llama.cpp renormalises the top-k weights of Mixtral and Qwen3-MoE, not Qwen2-MoE's;
    # `expert_weights_norm` overrides that.
    def moe_config(arch: str, **extra: Any) -> dict[str, Any]:
        meta = {
            "general.architecture": arch,
            f"{arch}.block_count": 2,
            f"{arch}.attention.head_count": 4,
            f"{arch}.embedding_length": 64,
            f"{arch}.feed_forward_length": 128,
            f"{arch}.expert_count": 4,
            f"{arch}.expert_used_count": 2,
            f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
            f"{arch}.context_length": 64,
            "tokenizer.ggml.tokens": ["a"],
            **{f"{arch}.{k}": v for k, v in extra.items()},
        }
        return hf_config_from_gguf(meta, ["blk.1.ffn_gate_inp.weight"])

    mixtral = moe_config("llama")
    assert mixtral["architectures"] == ["MixtralForCausalLM"]
    assert mixtral["norm_topk_prob"] and mixtral["num_experts"] == 4
    assert not moe_config("qwen2moe")["norm_topk_prob"]
    assert moe_config("qwen3moe")["norm_topk_prob"]
    assert not moe_config("qwen3moe", expert_weights_norm=False)["norm_topk_prob"]
    assert moe_config("qwen3moe")["mlp_only_layers"] == [0]  # no router in layer 0
    assert moe_config("llama", expert_count=0)["architectures"] == ["LlamaForCausalLM"]


def test_quantized_moe_gguf_keeps_experts_in_their_blocks_and_decodes_as_dequantized(
    tiny_model_factory: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ferrollm import LLM, SamplingParams
    from ferrollm.engine.build import load_model
    from ferrollm.models import registry

    monkeypatch.setattr(registry, "DENSE_COPY_BUDGET", 0)  # the block kernels at every size
    hf_dir = tiny_model_factory("qwen2-moe")
    q8 = write_tiny_gguf(hf_dir, tmp_path / "q8.gguf", "qwen2moe", "Q8_0")
    source = load_model_source(q8)
    model = load_model(source, torch.device("cpu"), torch.float32, "native")
    mlp = model.model.layers[1].mlp  # layer 0 is dense
    experts = [*mlp.experts, mlp.shared_expert]
    assert len(experts) == 5
    for layer in (p for e in experts for p in (e.gate_up_proj, e.down_proj)):
        assert layer.weight is None and layer.quantized is not None
        assert layer.quantized.scheme == "Q8_0"
    assert mlp.gate.weight is not None and mlp.gate.quantized is None  # the router: float
    # Each routed expert's down_proj is its own run of the stacked tensor's bytes, in place.
    mapped = np.frombuffer(source._file._map, np.uint8)  # type: ignore[attr-defined]
    starts = []
    for expert in mlp.experts:
        assert expert.down_proj.quantized is not None
        (segment,) = expert.down_proj.quantized.segments
        offset = segment.data.data_ptr() - mapped.ctypes.data
        assert offset >= 0 and offset + segment.data.numel() <= mapped.nbytes
        starts.append(offset)
    run = mlp.experts[0].down_proj.quantized.segments[0].data.numel()
    assert np.diff(starts).tolist() == [run] * (len(starts) - 1)

    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompts = ["The quick brown fox", "What is the capital of France?", "def f(x):"]
    options: dict[str, Any] = {"dtype": "float32", "kv_cache_memory": "4MiB", "max_model_len": 64}
    # The reference: the same file dequantized (against the float32 file, Q8_0's rounding
    # flips a near-tie of this random model: a test of Q8_0, not of the loader).
    quantized = LLM(q8, quantization="auto", **options).generate(prompts, params)
    reference = LLM(q8, quantization="none", **options).generate(prompts, params)
    for q, d in zip(quantized, reference, strict=True):
        assert q.outputs[0].token_ids == d.outputs[0].token_ids
