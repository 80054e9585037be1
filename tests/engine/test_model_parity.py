"""Greedy tokens and logprobs of the paged Llama-family model equal transformers' (float32).

Tiny random-weight models per family are built with transformers, their weights loaded into our
model through HF names, and the real Rust scheduler drives our runner (greedy = argmax in
Python). The reference is transformers' ``generate`` run on each prompt alone, so batching,
chunking, prefix hits, preemption and forks may not change a single token. Both run on
``--device`` (default cpu), our runner with that platform's attention backend.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
import transformers  # the oracle; pinned in requirements/dev.txt, so never skipped
from parity_support import BFLOAT16_ATOL, FLOAT32_ATOL, as_oracle, hf_greedy

from ferrollm import NewRequest, SamplingParams, Scheduler, SchedulerConfig
from ferrollm.executor.kv_cache import KVCache
from ferrollm.executor.runner import ModelRunner, profile_run
from ferrollm.models.config import SUPPORTED_ARCHITECTURES, ModelConfig, UnsupportedModelError
from ferrollm.models.llama import LlamaForCausalLM
from ferrollm.models.registry import MODEL_REGISTRY, build_model, resolve_model_class
from ferrollm.platforms import get_platform
from tiny_models import DEEPSEEK_SIZES, chatglm_name, to_chatglm

BLOCK_SIZE = 4
NUM_NEW_TOKENS = 8
MAX_MODEL_LEN = 64
VOCAB = 384
SMALL = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    # Wider than the default 0.02 so the top logits are well apart and argmax is stable.
    "initializer_range": 0.1,
}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
GLM_ROPE = {"rope_type": "default", "rope_theta": 50000.0, "partial_rotary_factor": 0.5}
GLM = {"pad_token_id": 0, "rope_parameters": GLM_ROPE}  # the default pad id lies past VOCAB
# Long rope whose original context (64) covers MAX_MODEL_LEN, so the engine runs the short
# factors, as transformers does for these prompts; cos/sin scaled by sqrt(1 + ln 4 / ln 64).
PHI3_LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "short_factor": [1.0, 1.3, 1.7, 2.2, 3.1, 4.5],
    "long_factor": [1.0, 2.5, 4.0, 6.0, 9.0, 16.0],
    "original_max_position_embeddings": MAX_MODEL_LEN,
}
PHI3_IDS = {"eos_token_id": 2, "pad_token_id": 0}  # Phi3Config's 32000 lie past VOCAB
# Latent attention, grouped experts, one shared expert, layer 0 dense: the tiny DeepSeek's.
DEEPSEEK = DEEPSEEK_SIZES
# YaRN whose mscale and mscale_all_dim differ, so both the cos/sin factor and the softmax
# scale move; its original context (32) lies inside MAX_MODEL_LEN.
DEEPSEEK_YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 32,
    "mscale": 1.0,
    "mscale_all_dim": 0.5,
    "beta_fast": 32,
    "beta_slow": 1,
}
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3": ("LlamaConfig", {"rope_parameters": LLAMA3_ROPE}),
    "mistral": ("MistralConfig", {"sliding_window": 7}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 24}),
    "tied": ("LlamaConfig", {"tie_word_embeddings": True}),
    # Llama's optional biases: q/k/v and o_proj together, and the MLP's gate/up/down.
    "llama-attn-bias": ("LlamaConfig", {"attention_bias": True}),
    "llama-mlp-bias": ("LlamaConfig", {"mlp_bias": True}),
    # A sliding layer (window 7, shorter than most prompts) then a full one, each with its own
    # rope (the full layers' scaled), a query scalar that is not head_dim, capped logits.
    # Every other layer sliding (window 7), one rope, attention scores and logits capped (small
    # caps, so that capping changes the tokens), through the runner's capping backend.
    "gemma2": (
        "Gemma2Config",
        {
            "head_dim": 16,
            "sliding_window": 7,
            "layer_types": ["sliding_attention", "full_attention"],
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 3.0,
        },
    ),
    "gemma3": (
        "Gemma3TextConfig",
        {
            "head_dim": 16,
            "sliding_window": 7,
            "layer_types": ["sliding_attention", "full_attention"],
            "query_pre_attn_scalar": 24,
            "final_logit_softcapping": 3.0,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        },
    ),
    # Mixture of experts: 8 experts, top-2, so a decode step leaves most experts without rows
    # and a prefill sends many rows to one expert (tests/engine/test_fused_moe.py).
    "mixtral": ("MixtralConfig", {"num_local_experts": 8, "num_experts_per_tok": 2}),
    # Shared expert behind its sigmoid gate; top-k weights not renormalised.
    "qwen2-moe": (
        "Qwen2MoeConfig",
        {
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48,
        },
    ),
    # q/k norm, renormalised top-k, and layer 0 dense (`mlp_only_layers`).
    "qwen3-moe": (
        "Qwen3MoeConfig",
        {
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "mlp_only_layers": [0],
        },
    ),
    # Half of each head rotated in interleaved pairs, q/k/v biases, gate/up saved fused;
    # head_dim 24 (not hidden / heads) rotates 12 features, a rope of its own base.
    "glm": ("GlmConfig", {"head_dim": 24, **GLM}),
    "glm4": ("Glm4Config", {"head_dim": 16, **GLM}),  # + post-block norms
    # A GlmForCausalLM saved as ChatGLM3's original checkpoint (`tiny_models.to_chatglm`).
    "chatglm": ("GlmConfig", {"head_dim": 16, **GLM}),
    # Fused qkv_proj / gate_up_proj checkpoint tensors, a window; then long rope over 12 of
    # each head's 16 dims (Phi-4-mini's partial rotary).
    "phi3": ("Phi3Config", {**PHI3_IDS, "sliding_window": 7}),
    # V2: plain q_proj, softmax scores, group-limited greedy routing, scaled weights, YaRN.
    "deepseek-v2": (
        "DeepseekV2Config",
        {
            **DEEPSEEK,
            "q_lora_rank": None,
            "topk_method": "group_limited_greedy",
            "routed_scaling_factor": 1.5,
            "rope_parameters": DEEPSEEK_YARN,
        },
    ),
    # V3: q through its low-rank bottleneck, sigmoid scores with a correction bias (randomized
    # in `Family`), renormalised top-k weights.
    "deepseek-v3": ("DeepseekV3Config", {**DEEPSEEK, "q_lora_rank": 24, "norm_topk_prob": True}),
    "phi3-longrope": (
        "Phi3Config",
        {
            **PHI3_IDS,
            "partial_rotary_factor": 0.75,
            "original_max_position_embeddings": MAX_MODEL_LEN,
            "rope_parameters": PHI3_LONGROPE,
        },
    ),
}


def model_config(hf: Any) -> ModelConfig:
    """ferrollm's ModelConfig for a transformers model, through the loader's own path."""
    config = hf.config.to_dict()
    config["architectures"] = [type(hf).__name__]
    return ModelConfig.from_hf_dict(config)


def _randomize_biases(model: torch.nn.Module) -> None:
    # transformers initializes biases to zero, which would hide a bias that is never loaded
    # (or loaded into the wrong shard of a merged projection), and norms to a constant, which
    # would hide a norm loaded into the wrong place or scaled the wrong way (Gemma's 1 + w).
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.1)
            elif name.endswith("norm.weight"):
                param.add_(torch.randn_like(param), alpha=0.1)
        for name, buffer in model.named_buffers():
            # DeepSeek-V3's router bias, zero at init, which would hide it being ignored.
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 0.1)


class Family:
    """A tiny HF model, our copy of it, and the per-prompt reference outputs (memoized).

    ``state`` and ``config`` are the checkpoint's: transformers' own, or for "chatglm" the
    model converted to ChatGLM3's names and config keys. Both models live on ``device``."""

    def __init__(self, name: str, device: str = "cpu") -> None:
        config_cls, extra = FAMILIES[name]
        hf_config = getattr(transformers, config_cls)(**{**SMALL, **extra})
        model_cls = transformers.AutoModelForCausalLM.from_config
        torch.manual_seed(sum(map(ord, name)))
        hf = model_cls(hf_config, dtype=torch.float32)
        _randomize_biases(hf)  # on the CPU: the same seeded weights whatever the device
        self.config = model_config(hf)
        self.state = hf.state_dict()  # CPU tensors, kept as they are when `hf` moves
        self.hf = as_oracle(hf, device)
        self.device = torch.device(device)
        self.name = chatglm_name if name == "chatglm" else str
        if name == "chatglm":
            chatglm_config, self.state = to_chatglm(hf_config.to_dict(), self.state)
            self.config = ModelConfig.from_hf_dict(chatglm_config)
        self._models: dict[torch.dtype, LlamaForCausalLM] = {}
        self._refs: dict[tuple[int, ...], tuple[list[int], torch.Tensor]] = {}

    def model(self, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
        """Our model in ``dtype``, with the HF model's weights."""
        if dtype not in self._models:
            model = build_model(self.config, self.device, dtype)
            model.set_max_model_len(MAX_MODEL_LEN)  # as the engine does once its cache is sized
            model.load_weights(self.state.items())
            self._models[dtype] = model
        return self._models[dtype]

    def reference(self, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
        """transformers' greedy tokens for ``prompt`` alone, and the log-softmax at each step."""
        key = tuple(prompt)
        if key not in self._refs:
            self._refs[key] = hf_greedy(self.hf, prompt, NUM_NEW_TOKENS)
        return self._refs[key]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, device: str) -> Family:
    return Family(request.param, device)


@dataclass
class Run:
    """What our engine produced: per (request, sequence) tokens and log-softmax rows."""

    tokens: dict[tuple[int, int], list[int]]
    logprobs: dict[tuple[int, int], list[torch.Tensor]]
    stats: dict[str, int]


def make_runner(family: Family, num_blocks: int, dtype: torch.dtype) -> ModelRunner:
    device = family.device
    spec = family.model(dtype).kv_cache_spec(BLOCK_SIZE, dtype)
    # The platform's attention (on the CPU the paged kernel), the backend its engine runs.
    backend = get_platform(device.type).attention_backend()
    kv_cache = KVCache(spec, num_blocks, device)
    return ModelRunner(family.model(dtype), kv_cache, device, dtype, backend)


def run_ours(
    family: Family,
    arrivals: dict[int, list[list[int]]],
    *,
    num_blocks: int = 256,
    max_num_batched_tokens: int = 512,
    n: int = 1,
    dtype: torch.dtype = torch.float32,
) -> tuple[Run, list[list[int]]]:
    """Drive the real scheduler over our runner; ``arrivals[step]`` are prompts added then."""
    runner = make_runner(family, num_blocks, dtype)
    scheduler = Scheduler(
        SchedulerConfig(
            num_blocks=num_blocks,
            block_size=BLOCK_SIZE,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=MAX_MODEL_LEN,
        )
    )
    params = SamplingParams(n=n, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    prompts: list[list[int]] = []
    run = Run(defaultdict(list), defaultdict(list), {})
    step = 0
    while scheduler.has_unfinished_requests() or step <= max(arrivals):
        for prompt in arrivals.get(step, []):
            scheduler.add_request(NewRequest(len(prompts), prompt, params))
            prompts.append(prompt)
        plan = scheduler.schedule()
        logits = runner.run(plan)
        assert logits.shape == (plan.num_samples, VOCAB) and logits.is_contiguous()
        out = scheduler.update(plan, logits.argmax(-1).numpy())
        for i, key in enumerate(zip(out.req_ids.tolist(), out.seq_indices.tolist(), strict=True)):
            run.tokens[key].append(int(out.token_ids[i]))
            run.logprobs[key].append(logits[i].log_softmax(-1))
        scheduler.check_invariants()
        step += 1
    run.stats = scheduler.stats()
    return run, prompts


def assert_matches_reference(
    family: Family, run: Run, prompts: list[list[int]], n: int = 1
) -> None:
    assert len(run.tokens) == len(prompts) * n
    for (req, seq), tokens in run.tokens.items():
        ref_tokens, ref_logprobs = family.reference(prompts[req])
        assert tokens == ref_tokens, f"request {req} sequence {seq}"
        ours = torch.stack(run.logprobs[(req, seq)])
        torch.testing.assert_close(ours, ref_logprobs, atol=FLOAT32_ATOL, rtol=0)


def random_prompts(
    seed: int, lengths: list[int], prefix: list[int] | None = None
) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    head = prefix or []
    return [head + rng.integers(1, VOCAB, size=length).tolist() for length in lengths]


# One pool of prompts for most tests, so each family's references are computed once. Lengths
# off the block boundary leave partial blocks (shared by forks: copy-on-write).
PROMPTS = random_prompts(1, [3, 17, 9, 1, 30, 13])


def test_batch_of_different_lengths(family: Family) -> None:
    run, prompts = run_ours(family, {0: PROMPTS})
    assert_matches_reference(family, run, prompts)


def test_chunked_prefill(family: Family) -> None:
    run, prompts = run_ours(family, {0: PROMPTS}, max_num_batched_tokens=7)
    assert_matches_reference(family, run, prompts)


def test_prefix_cache_hits(family: Family) -> None:
    prefix = random_prompts(2, [13])[0]
    first, *others = random_prompts(3, [2, 5, 0, 9, 3], prefix=prefix)
    # The later prompts arrive once the first prompt's full blocks are cached.
    run, prompts = run_ours(family, {0: [first], 2: others[:2], 5: others[2:]})
    assert run.stats["num_prefix_hit_blocks"] >= 3 * len(others)
    assert_matches_reference(family, run, prompts)


def test_preemption_with_a_tiny_kv_cache(family: Family) -> None:
    # 16 usable blocks (64 tokens) cannot hold these four sequences at once.
    run, prompts = run_ours(family, {0: PROMPTS[1:3] + PROMPTS[4:]}, num_blocks=17)
    assert run.stats["num_preemptions"] > 0
    assert_matches_reference(family, run, prompts)


def test_requests_joining_midway(family: Family) -> None:
    arrivals = {0: PROMPTS[:2], 3: PROMPTS[4:5], 6: [PROMPTS[3], PROMPTS[5]]}
    run, prompts = run_ours(family, arrivals, max_num_batched_tokens=16)
    assert_matches_reference(family, run, prompts)


def test_forks_of_a_greedy_request_agree(family: Family) -> None:
    run, prompts = run_ours(family, {0: [PROMPTS[2], PROMPTS[5]], 2: PROMPTS[:1]}, n=2)
    assert_matches_reference(family, run, prompts, n=2)
    for req in range(len(prompts)):
        assert run.tokens[(req, 0)] == run.tokens[(req, 1)]


def test_bfloat16_stays_close_to_float32(family: Family) -> None:
    run, prompts = run_ours(family, {0: PROMPTS}, dtype=torch.bfloat16)
    for (req, _), logprobs in run.logprobs.items():
        # Only the first step: later steps may follow a different (near-tie) token.
        first = family.reference(prompts[req])[1][0]
        torch.testing.assert_close(logprobs[0], first, atol=BFLOAT16_ATOL, rtol=0)


def test_profile_run_takes_a_full_step_on_a_two_block_cache(family: Family) -> None:
    spec = family.model().kv_cache_spec(4, torch.float32)
    profile_run(family.model(), spec, family.device, num_tokens=61, num_samples=5)


def test_unknown_architecture_lists_supported() -> None:
    with pytest.raises(UnsupportedModelError, match="Qwen3ForCausalLM") as info:
        resolve_model_class(["GPT2LMHeadModel"])
    assert "GPT2LMHeadModel" in str(info.value)
    assert set(MODEL_REGISTRY) == set(SUPPORTED_ARCHITECTURES)
    # One class runs the Llama-shaped families: the differences live in ModelConfig.
    assert resolve_model_class(["GPT2LMHeadModel", "Qwen2ForCausalLM"]) is LlamaForCausalLM


def test_model_has_exactly_the_parameters_of_transformers(family: Family) -> None:
    # Biases, q/k norms and the head follow the config: no tensor is missing or extra.
    # MoE models name each expert's projections where transformers stacks them in 3-D tensors.
    model = family.model()
    names = (name for name, _ in model.checkpoint_tensors(family.state.items()))
    expected = {n for n in names if not n.endswith("rotary_pos_emb.inv_freq")}
    if family.config.tie_word_embeddings:  # the head is the embedding matrix itself
        expected.remove("lm_head.weight")
    assert sorted(model.checkpoint_names()) == sorted(expected)


def test_load_weights_names_bad_tensors(family: Family) -> None:
    state = family.state
    model = build_model(family.config, family.device, torch.float32)
    norm = family.name("model.norm.weight")
    with pytest.raises(ValueError, match=rf"lacks 1 tensors.*{norm}"):
        model.load_weights((k, v) for k, v in state.items() if k != norm)
    with pytest.raises(ValueError, match=r"`model\.extra\.weight` does not belong"):
        model.load_weights([("model.extra.weight", torch.zeros(1))])
    name = family.name("model.layers.0.self_attn.k_proj.weight")
    if "qkv_proj" in model.fused_checkpoint and family.name is str:  # q, k and v in one tensor
        name = "model.layers.0.self_attn.qkv_proj.weight"
    if family.config.mla is not None:  # latent attention: no k_proj
        name = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    with pytest.raises(ValueError, match="shape"):
        model.load_weights([(name, state[name][:-1])])
