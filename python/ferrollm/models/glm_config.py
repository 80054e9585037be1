"""GLM's config dialects, normalised to the keys ``ModelConfig`` reads; torch-free.

transformers' GLM configs (``glm``, ``glm4``) are Llama-shaped but leave family defaults out
of an older config.json: q/k/v biases on, half of each head rotated, a tiny RMSNorm epsilon.
ChatGLM3 and GLM-4's original checkpoints (``chatglm``, run through the model repository's own
code, not transformers) are the same network under Megatron-style keys, mapped here as
transformers' GLM conversion maps them (``rope_ratio`` scales the base frequency, ``kv_channels``
is the head size, ``multi_query_group_num`` the KV heads). The first ChatGLM-6B (2D positions,
GLM-130B's blocks) is another network and is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ferrollm.models.config_fields import UnsupportedModelError, float_field, int_field

#: The model types whose configs this module normalises.
GLM_MODEL_TYPES = ("glm", "glm4", "chatglm")

#: transformers' GlmConfig / Glm4Config defaults for keys an older config.json may omit.
_GLM_DEFAULTS: Mapping[str, Any] = {
    "attention_bias": True,
    "rms_norm_eps": 1.5625e-07,
    "partial_rotary_factor": 0.5,
}

#: ChatGLM switches whose other value is another network: key -> (value ferrollm runs, why).
_CHATGLM_FIXED: Mapping[str, tuple[bool, str]] = {
    "rmsnorm": (True, "LayerNorm blocks"),
    "post_layer_norm": (True, "no final norm"),
    "apply_residual_connection_post_layernorm": (False, "residuals taken after the norm"),
    "add_bias_linear": (False, "biases on the output and MLP projections"),
    "fp32_residual_connection": (False, "a float32 residual stream"),
}


def glm_dialect(config: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """``config`` as a transformers GLM config.json with every family default filled in.

    Raises UnsupportedModelError for a ChatGLM variant that is another network, and
    ValueError naming the ChatGLM key that is missing or malformed.
    """
    normalised = dict(chatglm_as_glm(config) if model_type == "chatglm" else config)
    has_factor = "partial_rotary_factor" in (normalised.get("rope_parameters") or {})
    for key, value in _GLM_DEFAULTS.items():
        if key != "partial_rotary_factor" or not has_factor:
            normalised.setdefault(key, value)
    return normalised


def chatglm_as_glm(config: Mapping[str, Any]) -> dict[str, Any]:
    """A ChatGLM2/3 or GLM-4 original config (``model_type`` chatglm) under GLM's keys."""
    if config.get("position_encoding_2d") or "padded_vocab_size" not in config:
        raise UnsupportedModelError(
            "config.json: the first ChatGLM-6B (`position_encoding_2d`, no `padded_vocab_size`) "
            "is not supported; ChatGLM2/3 and GLM-4 are"
        )
    for key, (value, other) in _CHATGLM_FIXED.items():
        if key in config and bool(config[key]) != value:
            raise UnsupportedModelError(
                f"config.json: `{key}` {config[key]!r} ({other}) is not supported; "
                f"ChatGLM3 and GLM-4 have {value}"
            )
    hidden = int_field(config, "hidden_size")
    num_heads = int_field(config, "num_attention_heads")
    multi_query = bool(config.get("multi_query_attention", False))
    rope_ratio = float_field(config, "rope_ratio", default=1.0)
    return {
        "architectures": config.get("architectures"),
        "model_type": "chatglm",
        "vocab_size": int_field(config, "padded_vocab_size"),
        "hidden_size": hidden,
        "intermediate_size": int_field(config, "ffn_hidden_size"),
        "num_hidden_layers": int_field(config, "num_layers"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": (
            int_field(config, "multi_query_group_num") if multi_query else num_heads
        ),
        "head_dim": int_field(config, "kv_channels", default=hidden // num_heads),
        "rms_norm_eps": float_field(config, "layernorm_epsilon", default=1e-5),
        # ChatGLM rotates a rope of half the head size (its `rotary_dim // 2`).
        "rope_theta": 10000.0 * rope_ratio,
        "partial_rotary_factor": 0.5,
        "max_position_embeddings": int_field(config, "seq_length", default=8192),
        "attention_bias": bool(config.get("add_qkv_bias", False)),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
        "bos_token_id": config.get("bos_token_id"),
        "eos_token_id": config.get("eos_token_id"),
        "pad_token_id": config.get("pad_token_id"),
        "torch_dtype": config.get("torch_dtype", config.get("dtype")),
    }
