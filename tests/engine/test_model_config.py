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
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, UnsupportedModelError, "'yarn'"),
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
