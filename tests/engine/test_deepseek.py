"""DeepSeek-V2/V3 beyond the parity families: the latent cache's size, the router against a
per-token reference, the attention backends over one tensor as both caches, and what is
refused. Token-for-token parity is ``test_model_parity.py``'s "deepseek-v2"/"deepseek-v3"."""

from __future__ import annotations

from typing import Any

import pytest
import test_model_parity as parity
import torch
from test_model_parity import PROMPTS, Family, assert_matches_reference, run_ours

from ferrollm.distributed.shard_plan import TensorSlice
from ferrollm.distributed.state import ParallelState
from ferrollm.executor.kv_cache import KVCache
from ferrollm.layers.attention import TorchSDPABackend
from ferrollm.layers.fused_moe import select_grouped_experts
from ferrollm.models.config import ModelConfig
from ferrollm.models.deepseek import DeepseekForCausalLM
from ferrollm.platforms.cpu import CpuPlatform

#: deepseek-ai/DeepSeek-V2-Lite's config.json, less its training-only keys.
DEEPSEEK_V2_LITE: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "vocab_size": 102400,
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_shared_experts": 2,
    "n_routed_experts": 64,
    "num_experts_per_tok": 6,
    "routed_scaling_factor": 1.0,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "topk_method": "greedy",
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": False,
    "scoring_func": "softmax",
    "first_k_dense_replace": 1,
    "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 100000,
    "eos_token_id": 100001,
}


@pytest.mark.parametrize("name", ["deepseek-v2", "deepseek-v3"])
def test_the_cache_holds_one_latent_row_per_token_and_layer(name: str) -> None:
    family = Family(name)
    mla = family.config.mla
    assert mla is not None
    spec = family.model().kv_cache_spec(4, torch.float32)
    # Not 2x (K and V) and not per head: one [c, k_pe] row of 32 + 8 floats per layer.
    layers = family.config.num_hidden_layers
    assert spec.bytes_per_token == layers * (mla.kv_lora_rank + mla.qk_rope_head_dim) * 4 == 320
    assert spec.bytes_per_block == 4 * spec.bytes_per_token
    cache = KVCache(spec, 3, torch.device("cpu"))
    assert all(k is v for k, v in cache.layers)


def test_deepseek_v2_lite_caches_576_values_a_token_and_layer() -> None:
    config = ModelConfig.from_hf_dict(DEEPSEEK_V2_LITE)
    with torch.device("meta"):  # 16B parameters: shapes only
        model = DeepseekForCausalLM(config)
    spec = model.kv_cache_spec(16, torch.bfloat16)
    assert (spec.num_kv_heads, spec.head_dim, spec.values_are_keys) == (1, 576, True)
    assert spec.bytes_per_token == 27 * 576 * 2 == 31104


def _reference_router(
    logits: torch.Tensor,
    top_k: int,
    scoring: str,
    num_groups: int,
    topk_groups: int,
    bias: torch.Tensor | None,
    renormalize: bool,
    scale: float,
) -> list[tuple[set[int], dict[int, float]]]:
    """One token at a time, in plain Python: the groups, then the experts, then the weights."""
    out = []
    for row in logits.tolist():
        t = torch.tensor(row)
        scores = (t.softmax(-1) if scoring == "softmax" else t.sigmoid()).tolist()
        offsets = [0.0] * len(scores) if bias is None else bias.tolist()
        choice = [s + b for s, b in zip(scores, offsets, strict=True)]
        size = len(scores) // num_groups
        groups = [choice[g * size : (g + 1) * size] for g in range(num_groups)]
        if scoring == "softmax":
            group_scores = [max(g) for g in groups]
        else:
            group_scores = [sum(sorted(g)[-2:]) for g in groups]
        kept = sorted(range(num_groups), key=lambda g: -group_scores[g])[:topk_groups]
        candidates = [e for g in kept for e in range(g * size, (g + 1) * size)]
        chosen = sorted(candidates, key=lambda e: -choice[e])[:top_k]
        total = sum(scores[e] for e in chosen) if renormalize else 1.0
        out.append((set(chosen), {e: scores[e] / total * scale for e in chosen}))
    return out


@pytest.mark.parametrize(
    ("scoring", "num_groups", "topk_groups", "with_bias", "renormalize"),
    [
        ("softmax", 1, 1, False, False),  # V2 greedy
        ("softmax", 4, 2, False, False),  # V2 group_limited_greedy
        ("softmax", 4, 1, False, True),
        ("sigmoid", 4, 2, True, True),  # V3 noaux_tc
        ("sigmoid", 8, 3, True, False),
    ],
)
def test_grouped_router_matches_a_per_token_reference(
    scoring: str, num_groups: int, topk_groups: int, with_bias: bool, renormalize: bool
) -> None:
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(50, 16, generator=gen)
    bias = torch.randn(16, generator=gen) * 0.3 if with_bias else None
    weights, ids = select_grouped_experts(
        logits,
        3,
        scoring_func=scoring,
        num_groups=num_groups,
        topk_groups=topk_groups,
        renormalize=renormalize,
        scaling_factor=2.5,
        correction_bias=bias,
    )
    reference = _reference_router(
        logits, 3, scoring, num_groups, topk_groups, bias, renormalize, 2.5
    )
    for t, (chosen, expected) in enumerate(reference):
        assert set(ids[t].tolist()) == chosen, f"token {t}"
        got = dict(zip(ids[t].tolist(), weights[t].tolist(), strict=True))
        for e, w in expected.items():
            assert got[e] == pytest.approx(w, rel=1e-5), f"token {t} expert {e}"


def test_latent_cache_on_the_sdpa_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    # The parity families run the CPU platform's paged-kernel backend; the portable SDPA
    # backend takes the one cache tensor as both K and V too.
    monkeypatch.setattr(CpuPlatform, "attention_backend", lambda self: TorchSDPABackend())
    family = Family("deepseek-v3")
    run, prompts = run_ours(family, {0: PROMPTS}, max_num_batched_tokens=7)
    assert_matches_reference(family, run, prompts)


def test_deepseek_v3_rope_in_halves(monkeypatch: pytest.MonkeyPatch) -> None:
    # rope_interleave false: Llama's rotate-half layout instead of adjacent pairs.
    cls, extra = parity.FAMILIES["deepseek-v3"]
    monkeypatch.setitem(parity.FAMILIES, "v3-halves", (cls, {**extra, "rope_interleave": False}))
    family = Family("v3-halves")
    assert family.config.mla is not None and not family.config.mla.rope_interleave
    run, prompts = run_ours(family, {0: PROMPTS[:3]})
    assert_matches_reference(family, run, prompts)


def test_a_rank_of_two_holds_half_the_heads_and_expert_features_and_the_whole_latent() -> None:
    config = ModelConfig.from_hf_dict(DEEPSEEK_V2_LITE)
    with torch.device("meta"):  # shapes only
        model = DeepseekForCausalLM(config, None, ParallelState(1, 2))
    attn = model.model.layers[1].self_attn
    assert attn.num_heads == 8
    assert attn.q_proj is not None and attn.q_proj.out_features == 8 * (128 + 64)
    assert attn.kv_b_proj.out_features == 8 * (128 + 128)
    assert attn.o_proj.in_features == 8 * 128
    assert attn.kv_a_proj_with_mqa.out_features == 512 + 64  # the latent, whole
    moe = model.model.layers[1].mlp
    assert moe.experts[0].down_proj.in_features == 1408 // 2
    assert moe.shared_experts.down_proj.in_features == 2 * 1408 // 2
    # Every rank caches the same latent rows: bytes per token do not shrink with the group.
    assert model.kv_cache_spec(16, torch.bfloat16).bytes_per_token == 31104
    plan = model.shard_plan().slices
    assert plan["model.layers.3.self_attn.kv_b_proj.weight"] == TensorSlice(0, 8 * 256, 16 * 256)
    assert plan["model.layers.3.self_attn.o_proj.weight"] == TensorSlice(1, 8 * 128, 16 * 128)
    assert plan["model.layers.3.mlp.experts.63.down_proj.weight"] == TensorSlice(1, 704, 1408)
    assert "model.layers.3.self_attn.kv_a_proj_with_mqa.weight" not in plan


def test_heads_that_cannot_split_are_refused_naming_the_option() -> None:
    config = ModelConfig.from_hf_dict(DEEPSEEK_V2_LITE)
    with pytest.raises(ValueError, match="`tensor_parallel_size` 3") as err, torch.device("meta"):
        DeepseekForCausalLM(config, None, ParallelState(0, 3))
    assert "`num_attention_heads` (16) must divide evenly" in str(err.value)
