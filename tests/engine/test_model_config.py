"""`ModelConfig.from_hf_dict`: normalisation across config.json dialects, and its errors."""

from __future__ import annotations

import math
from typing import Any

import pytest

from ferrollm.models.config import (
    SUPPORTED_ARCHITECTURES,
    ModelConfig,
    RopeScaling,
    UnsupportedModelError,
)

BASE: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def config(**changes: Any) -> ModelConfig:
    return ModelConfig.from_hf_dict({**BASE, **changes})


def test_defaults_fill_what_config_json_leaves_out() -> None:
    c = config()
    assert (c.num_key_value_heads, c.head_dim, c.num_queries_per_kv) == (8, 8, 1)
    assert (c.rope_theta, c.rope_scaling, c.rms_norm_eps) == (10000.0, None, 1e-6)
    assert (c.max_position_embeddings, c.tie_word_embeddings) == (2048, False)
    assert (c.bos_token_id, c.eos_token_ids, c.dtype) == (None, (), None)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        # transformers < 5: top-level rope_theta and rope_scaling with "type" or "rope_type".
        ({"rope_theta": 5e5, "rope_scaling": {**LLAMA3}}, (5e5, "llama3")),
        ({"rope_scaling": {**LLAMA3, "type": "llama3", "rope_type": None}}, (1e4, "llama3")),
        (
            {
                "rope_scaling": {
                    "type": "llama3",
                    **{k: v for k, v in LLAMA3.items() if k != "rope_type"},
                }
            },
            (1e4, "llama3"),
        ),
        # transformers >= 5: rope_parameters holds theta too.
        ({"rope_parameters": {**LLAMA3, "rope_theta": 5e5}}, (5e5, "llama3")),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, (1e6, None)),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, (1e4, "linear")),
    ],
)
def test_rope_dialects_normalise(
    changes: dict[str, Any], expected: tuple[float, str | None]
) -> None:
    c = config(**changes)
    scaling_type = None if c.rope_scaling is None else c.rope_scaling.rope_type
    assert (c.rope_theta, scaling_type) == expected


def test_llama3_scaling_reads_as_a_mapping() -> None:
    scaling = config(rope_scaling=LLAMA3).rope_scaling
    assert isinstance(scaling, RopeScaling)
    assert dict(scaling) == LLAMA3
    assert scaling["factor"] == scaling.factor == 8.0
    assert scaling.get("rope_type") == "llama3"
    assert dict(RopeScaling("linear", 2.0)) == {"rope_type": "linear", "factor": 2.0}
    with pytest.raises(KeyError):
        RopeScaling("linear", 2.0)["low_freq_factor"]


@pytest.mark.parametrize(
    ("architecture", "changes", "flags"),
    [
        # (attention_bias, o_proj_bias, mlp_bias, qk_norm, head_dim)
        ("LlamaForCausalLM", {}, (False, False, False, False, 8)),
        ("LlamaForCausalLM", {"attention_bias": True}, (True, True, False, False, 8)),
        ("LlamaForCausalLM", {"mlp_bias": True}, (False, False, True, False, 8)),
        ("MistralForCausalLM", {"attention_bias": True}, (False, False, False, False, 8)),
        # Qwen2 configs never say "bias"; transformers' Qwen2/Qwen3 MLPs have none.
        ("Qwen2ForCausalLM", {"mlp_bias": True}, (True, False, False, False, 8)),
        ("Qwen3ForCausalLM", {}, (False, False, False, True, 128)),  # transformers' default
        (
            "Qwen3ForCausalLM",
            {"head_dim": 16, "attention_bias": True},
            (True, True, False, True, 16),
        ),
    ],
)
def test_family_traits_come_from_the_architecture(
    architecture: str, changes: dict[str, Any], flags: tuple[bool, bool, bool, bool, int]
) -> None:
    c = config(architectures=[architecture], **changes)
    assert c.model_type == SUPPORTED_ARCHITECTURES[architecture].model_type
    assert (c.attention_bias, c.o_proj_bias, c.mlp_bias, c.qk_norm, c.head_dim) == flags


def test_eos_ids_merge_config_and_generation_config() -> None:
    c = ModelConfig.from_hf_dict(
        {**BASE, "eos_token_id": 2, "bos_token_id": 1}, {"eos_token_id": [7, 2, 9]}
    )
    assert (c.bos_token_id, c.eos_token_ids) == (1, (2, 7, 9))


def test_sliding_window() -> None:
    mistral = {"architectures": ["MistralForCausalLM"]}
    assert config(**mistral, sliding_window=4096).sliding_window == 4096
    assert config(**mistral, sliding_window=None).sliding_window is None
    qwen2 = {"architectures": ["Qwen2ForCausalLM"], "sliding_window": 4096}
    assert config(**qwen2, use_sliding_window=False).sliding_window is None
    with pytest.raises(UnsupportedModelError, match="use_sliding_window"):
        config(**qwen2, use_sliding_window=True)


def test_missing_architectures_fall_back_on_model_type() -> None:
    assert config(architectures=None, model_type="qwen2").architecture == "Qwen2ForCausalLM"


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, UnsupportedModelError, "GPT2LMHeadModel"),
        ({"architectures": None, "model_type": "gpt2"}, UnsupportedModelError, "model_type=gpt2"),
        ({"hidden_size": None}, ValueError, "`hidden_size` is missing"),
        ({"vocab_size": "100"}, ValueError, "`vocab_size` must be a positive integer"),
        ({"num_key_value_heads": 3}, ValueError, "must be a multiple of `num_key_value_heads`"),
        ({"hidden_act": "gelu"}, UnsupportedModelError, "`hidden_act` must be 'silu'"),
        ({"rms_norm_eps": 0}, ValueError, "`rms_norm_eps` must be a positive number"),
        (
            {"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}},
            UnsupportedModelError,
            "'dynamic'",
        ),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, ValueError, "original_max"),
    ],
)
def test_errors_name_the_field(
    changes: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message) as excinfo:
        config(**changes)
    if error is UnsupportedModelError and "architectures" in changes:
        assert all(name in str(excinfo.value) for name in SUPPORTED_ARCHITECTURES)


MIXTRAL = {
    **BASE,
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}
QWEN_MOE = {
    **BASE,
    "architectures": ["Qwen2MoeForCausalLM"],
    "model_type": "qwen2_moe",
    "num_hidden_layers": 4,
    "num_experts": 6,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 96,
}


def test_dense_families_have_no_experts() -> None:
    assert config().moe is None


def test_mixtral_experts_are_intermediate_size_and_always_renormalised() -> None:
    c = ModelConfig.from_hf_dict({**MIXTRAL, "norm_topk_prob": False, "sliding_window": 5})
    assert c.moe is not None
    assert (c.moe.num_experts, c.moe.num_experts_per_tok) == (8, 2)
    assert (c.moe.expert_intermediate_size, c.moe.renormalize) == (128, True)
    assert (c.moe.shared_expert_intermediate_size, c.moe.dense_layers) == (0, ())
    assert (c.sliding_window, c.attention_bias, c.qk_norm) == (5, False, False)


@pytest.mark.parametrize(
    ("changes", "dense_layers"),
    [
        ({}, ()),
        ({"decoder_sparse_step": 2}, (0, 2)),  # layer i is sparse when (i + 1) % step == 0
        ({"mlp_only_layers": [1, 3]}, (1, 3)),
        ({"mlp_only_layers": [0], "decoder_sparse_step": 2}, (0, 2)),
    ],
)
def test_qwen_moe_dense_layers(changes: dict[str, Any], dense_layers: tuple[int, ...]) -> None:
    c = ModelConfig.from_hf_dict({**QWEN_MOE, **changes})
    assert c.moe is not None
    assert c.moe.dense_layers == dense_layers
    assert (c.moe.expert_intermediate_size, c.moe.shared_expert_intermediate_size) == (32, 96)
    assert c.moe.renormalize is False
    assert c.attention_bias and not c.o_proj_bias  # Qwen2's attention


def test_qwen3_moe_reads_either_expert_count_and_norm_topk_prob() -> None:
    qwen3 = {**QWEN_MOE, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe"}
    del qwen3["num_experts"]  # transformers 5 writes Mixtral's key for Qwen3-MoE
    c = ModelConfig.from_hf_dict({**qwen3, "num_local_experts": 5, "norm_topk_prob": True})
    assert c.moe is not None
    assert (c.moe.num_experts, c.moe.renormalize, c.moe.shared_expert_intermediate_size) == (
        5,
        True,
        0,
    )
    assert c.qk_norm


@pytest.mark.parametrize(
    ("base", "changes", "message"),
    [
        (MIXTRAL, {"num_local_experts": None}, "`num_local_experts` is missing"),
        (MIXTRAL, {"num_experts_per_tok": 9}, r"`num_experts_per_tok` \(9\) must be at most"),
        (QWEN_MOE, {"moe_intermediate_size": 0}, "`moe_intermediate_size` must be a positive"),
        (QWEN_MOE, {"shared_expert_intermediate_size": None}, "`shared_expert_intermediate_size`"),
        (QWEN_MOE, {"mlp_only_layers": [4]}, "`mlp_only_layers` must list layer indices below 4"),
        (QWEN_MOE, {"use_sliding_window": True, "sliding_window": 8}, "`use_sliding_window`"),
    ],
)
def test_moe_errors_name_the_field(
    base: dict[str, Any], changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_dict({**base, **changes})


#: THUDM/chatglm3-6b's config.json, less its dropout and fusion switches.
CHATGLM3_6B: dict[str, Any] = {
    "architectures": ["ChatGLMModel"],
    "model_type": "chatglm",
    "add_bias_linear": False,
    "add_qkv_bias": True,
    "apply_query_key_layer_scaling": True,
    "apply_residual_connection_post_layernorm": False,
    "ffn_hidden_size": 13696,
    "fp32_residual_connection": False,
    "hidden_size": 4096,
    "kv_channels": 128,
    "layernorm_epsilon": 1e-05,
    "multi_query_attention": True,
    "multi_query_group_num": 2,
    "num_attention_heads": 32,
    "num_layers": 28,
    "original_rope": True,
    "padded_vocab_size": 65024,
    "post_layer_norm": True,
    "rmsnorm": True,
    "seq_length": 8192,
    "torch_dtype": "float16",
    "tie_word_embeddings": False,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def test_glm_defaults_are_transformers() -> None:
    # An older GLM config.json leaves out the bias, the rotary share and the epsilon.
    for architecture in ("GlmForCausalLM", "Glm4ForCausalLM"):
        c = config(architectures=[architecture], num_key_value_heads=2)
        assert (c.attention_bias, c.o_proj_bias, c.mlp_bias, c.qk_norm) == (
            True,
            False,
            False,
            False,
        )
        assert (c.head_dim, c.partial_rotary_factor, c.rms_norm_eps) == (128, 0.5, 1.5625e-07)
    # transformers >= 5 writes the share inside rope_parameters; older ones at the top level.
    rope = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25}
    assert (
        config(architectures=["GlmForCausalLM"], rope_parameters=rope).partial_rotary_factor == 0.25
    )
    glm = {"architectures": ["GlmForCausalLM"]}
    assert config(**glm, partial_rotary_factor=0.75).partial_rotary_factor == 0.75
    # Llama turns whole heads: transformers' Llama cannot run a partial rotary either.
    assert config(partial_rotary_factor=0.5).partial_rotary_factor == 1.0
    with pytest.raises(ValueError, match="`partial_rotary_factor` must be in"):
        config(**glm, partial_rotary_factor=2.0)


@pytest.mark.parametrize("architecture", ["ChatGLMModel", "ChatGLMForConditionalGeneration"])
def test_chatglm_keys_map_to_glm(architecture: str) -> None:
    c = ModelConfig.from_hf_dict({**CHATGLM3_6B, "architectures": [architecture]})
    assert (c.architecture, c.model_type) == (architecture, "chatglm")
    assert (c.vocab_size, c.hidden_size, c.intermediate_size) == (65024, 4096, 13696)
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (28, 32, 2)
    assert (c.head_dim, c.partial_rotary_factor, c.rope_theta) == (128, 0.5, 10000.0)
    assert (c.rms_norm_eps, c.max_position_embeddings) == (1e-5, 8192)
    assert (c.attention_bias, c.o_proj_bias, c.mlp_bias) == (True, False, False)
    assert (c.eos_token_ids, c.pad_token_id, c.dtype) == ((2,), 0, "float16")
    # GLM-4-9B-chat's original checkpoint: a long-context rope through `rope_ratio`.
    glm4 = ModelConfig.from_hf_dict({**CHATGLM3_6B, "rope_ratio": 500, "seq_length": 131072})
    assert (glm4.rope_theta, glm4.max_position_embeddings) == (5e6, 131072)
    # Without multi-query attention every head has its own keys and values.
    mha = ModelConfig.from_hf_dict({**CHATGLM3_6B, "multi_query_attention": False})
    assert mha.num_key_value_heads == 32
    no_arch = {**CHATGLM3_6B, "architectures": None}
    assert ModelConfig.from_hf_dict(no_arch).model_type == "chatglm"


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"position_encoding_2d": True}, UnsupportedModelError, "first ChatGLM-6B"),
        ({"padded_vocab_size": None}, UnsupportedModelError, "first ChatGLM-6B"),
        ({"add_bias_linear": True}, UnsupportedModelError, "`add_bias_linear` True"),
        ({"rmsnorm": False}, UnsupportedModelError, "`rmsnorm` False"),
        ({"ffn_hidden_size": None}, ValueError, "`ffn_hidden_size` is missing"),
        ({"num_layers": 0}, ValueError, "`num_layers` must be a positive integer"),
        ({"rope_ratio": -1}, ValueError, "`rope_ratio` must be a positive number"),
    ],
)
def test_chatglm_errors_name_its_keys(
    changes: dict[str, Any], error: type[Exception], message: str
) -> None:
    bad = {k: v for k, v in {**CHATGLM3_6B, **changes}.items() if v is not None}
    with pytest.raises(error, match=message):
        ModelConfig.from_hf_dict(bad)


#: Phi-3-mini-128k's shape of config.json (transformers < 5), with 4 factors per set (head 8).
PHI3: dict[str, Any] = {
    **BASE,
    "architectures": ["Phi3ForCausalLM"],
    "model_type": "phi3",
    "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096,
    "sliding_window": 262144,
    "rope_scaling": {
        "type": "longrope",
        "short_factor": [1.0, 1.1, 1.2, 1.3],
        "long_factor": [1.0, 2.0, 4.0, 8.0],
    },
}


def test_phi3_long_rope_resolves_factor_and_attention_factor() -> None:
    c = ModelConfig.from_hf_dict(PHI3)
    scaling = c.rope_scaling
    assert scaling is not None and scaling.rope_type == "longrope"
    assert (c.attention_bias, c.o_proj_bias, c.mlp_bias, c.qk_norm) == (False,) * 4
    assert (c.sliding_window, c.partial_rotary_factor) == (262144, 1.0)
    assert scaling.factor == 32.0  # max_position_embeddings / original
    assert scaling.attention_factor == pytest.approx((1 + math.log(32) / math.log(4096)) ** 0.5)
    assert (scaling.short_factor, scaling.long_factor) == ((1.0, 1.1, 1.2, 1.3), (1, 2, 4, 8))
    assert scaling["original_max_position_embeddings"] == 4096


@pytest.mark.parametrize(
    ("changes", "rope", "expected"),
    [
        # (factor, attention_factor, original_max_position_embeddings)
        ({}, {"attention_factor": 1.25}, (32.0, 1.25, 4096)),  # the config's own
        ({}, {"factor": 2.0}, (2.0, (1 + math.log(2) / math.log(4096)) ** 0.5, 4096)),
        ({"max_position_embeddings": 4096}, {}, (1.0, 1.0, 4096)),  # no extension: 1
        ({}, {"type": "su"}, (32.0, None, 4096)),  # Phi-3's first name for it
        # transformers prefers the top-level original context, else the model's own.
        ({}, {"original_max_position_embeddings": 8192}, (32.0, None, 4096)),
        ({"original_max_position_embeddings": None}, {}, (1.0, 1.0, 131072)),
    ],
)
def test_phi3_long_rope_dialects(
    changes: dict[str, Any], rope: dict[str, Any], expected: tuple[float, float | None, int]
) -> None:
    c = ModelConfig.from_hf_dict(
        {**PHI3, **changes, "rope_scaling": {**PHI3["rope_scaling"], **rope}}
    )
    scaling = c.rope_scaling
    assert scaling is not None
    factor, attention, original = expected
    assert (scaling.factor, scaling.original_max_position_embeddings) == (factor, original)
    if attention is not None:
        assert scaling.attention_factor == pytest.approx(attention)


def test_partial_rotary_factor_is_phi3s_and_sizes_the_factor_lists() -> None:
    # transformers >= 5 moves it into rope_parameters; older configs keep it top-level.
    rope = {**PHI3["rope_scaling"], "short_factor": [1.0] * 3, "long_factor": [2.0] * 3}
    top = ModelConfig.from_hf_dict({**PHI3, "partial_rotary_factor": 0.75, "rope_scaling": rope})
    inside = ModelConfig.from_hf_dict(
        {**PHI3, "rope_scaling": None, "rope_parameters": {**rope, "partial_rotary_factor": 0.75}}
    )
    assert top.partial_rotary_factor == inside.partial_rotary_factor == 0.75
    assert top.rope_scaling == inside.rope_scaling
    # Llama's rope turns every dim whatever the key says (transformers ignores it there).
    assert config(partial_rotary_factor=0.5).partial_rotary_factor == 1.0
    with pytest.raises(ValueError, match=r"`rope_scaling.short_factor` must list 4 positive"):
        ModelConfig.from_hf_dict({**PHI3, "rope_scaling": rope})
    with pytest.raises(ValueError, match=r"`partial_rotary_factor` must be in \(0, 1\]"):
        ModelConfig.from_hf_dict({**PHI3, "partial_rotary_factor": 1.5})


def test_phi3_without_long_rope() -> None:
    # Phi-3-mini-4k: plain rope, a 2047-token window.
    c = ModelConfig.from_hf_dict({**PHI3, "rope_scaling": None, "sliding_window": 2047})
    assert (c.rope_scaling, c.sliding_window, c.architecture) == (None, 2047, "Phi3ForCausalLM")


#: The DeepSeek-V2/V3 keys of a config.json (a tiny V2 with group-limited routing).
DEEPSEEK_V2: dict[str, Any] = {
    **BASE,
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "kv_lora_rank": 32,
    "q_lora_rank": None,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 32,
    "n_group": 4,
    "topk_group": 2,
    "topk_method": "group_limited_greedy",
    "routed_scaling_factor": 1.5,
    "first_k_dense_replace": 1,
    "head_dim": 8,  # transformers writes the rope part here
}
DEEPSEEK_V3 = {
    **DEEPSEEK_V2,
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "q_lora_rank": 24,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
}


def test_deepseek_v2_latent_attention_and_router() -> None:
    c = ModelConfig.from_hf_dict(DEEPSEEK_V2)
    assert c.mla is not None and c.deepseek_moe is not None
    assert c.head_dim == 24  # the query/key heads: nope + rope, not config.json's rope part
    assert (c.mla.kv_lora_rank, c.mla.q_lora_rank, c.mla.cache_head_dim) == (32, None, 40)
    assert c.mla.rope_interleave
    moe = c.deepseek_moe
    assert (moe.scoring_func, moe.topk_method, moe.num_groups, moe.topk_groups) == (
        "softmax",
        "group_limited_greedy",
        4,
        2,
    )
    assert (moe.num_shared_experts, moe.first_k_dense_replace, moe.renormalize) == (1, 1, False)
    assert moe.routed_scaling_factor == 1.5 and c.moe is None
    greedy = ModelConfig.from_hf_dict({**DEEPSEEK_V2, "topk_method": "greedy"}).deepseek_moe
    assert greedy is not None and (greedy.num_groups, greedy.topk_groups) == (1, 1)


def test_deepseek_v3_is_sigmoid_noaux_tc_with_its_own_rope_layout() -> None:
    c = ModelConfig.from_hf_dict(DEEPSEEK_V3)
    assert c.mla is not None and c.deepseek_moe is not None
    assert c.mla.q_lora_rank == 24 and c.mla.rope_interleave
    assert (c.deepseek_moe.scoring_func, c.deepseek_moe.topk_method) == ("sigmoid", "noaux_tc")
    assert c.deepseek_moe.renormalize
    halves = ModelConfig.from_hf_dict({**DEEPSEEK_V3, "rope_interleave": False})
    assert halves.mla is not None and not halves.mla.rope_interleave
    assert config().mla is None and config().deepseek_moe is None


@pytest.mark.parametrize(
    ("rope", "attention_factor", "truncate"),
    [
        # DeepSeek-V2's: equal mscales cancel in the cos/sin factor (the softmax keeps its own).
        (
            {
                "type": "yarn",
                "factor": 40,
                "mscale": 0.707,
                "mscale_all_dim": 0.707,
                "original_max_position_embeddings": 4096,
                "beta_fast": 32,
                "beta_slow": 1,
            },
            1.0,
            True,
        ),
        (
            {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32,
                "truncate": False,
            },
            0.1 * math.log(4.0) + 1.0,
            False,
        ),
    ],
)
def test_yarn_resolves_its_attention_factor(
    rope: dict[str, Any], attention_factor: float, truncate: bool
) -> None:
    c = ModelConfig.from_hf_dict({**DEEPSEEK_V2, "rope_scaling": rope})
    assert c.rope_scaling is not None and c.rope_scaling.rope_type == "yarn"
    assert c.rope_scaling.attention_factor == pytest.approx(attention_factor)
    assert c.rope_scaling.truncate is truncate
    assert (c.rope_scaling.beta_fast, c.rope_scaling.beta_slow) == (32.0, 1.0)


@pytest.mark.parametrize(
    ("base", "changes", "message"),
    [
        (DEEPSEEK_V2, {"kv_lora_rank": None}, "`kv_lora_rank` is missing"),
        (DEEPSEEK_V2, {"scoring_func": "sigmoid"}, "`scoring_func` must be 'softmax'"),
        (DEEPSEEK_V2, {"topk_method": "noaux_tc"}, "`topk_method` must be one of greedy"),
        (DEEPSEEK_V3, {"scoring_func": "softmax"}, "`scoring_func` must be 'sigmoid'"),
        (DEEPSEEK_V2, {"n_group": 3}, "`n_group` \\(3\\) must divide"),
        (DEEPSEEK_V2, {"first_k_dense_replace": -1}, "`first_k_dense_replace` must be a non-neg"),
        (DEEPSEEK_V2, {"rope_scaling": {"type": "yarn", "factor": 4}}, "`original_max_position"),
    ],
)
def test_deepseek_errors_name_the_field(
    base: dict[str, Any], changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_dict({**base, **changes})
