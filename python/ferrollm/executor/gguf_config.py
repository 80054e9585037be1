"""A GGUF file's ``<arch>.*`` metadata as the ``config.json`` dict of the transformers model
it was converted from, the way llama.cpp reads the file (torch-free: `ferrollm.preflight`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ferrollm.executor import gguf_chatglm, gguf_deepseek, gguf_glm4, gguf_phi3
from ferrollm.models.config import UnsupportedModelError

logger = logging.getLogger(__name__)

#: ``general.architecture`` -> the transformers architecture it loads as.
GGUF_ARCHITECTURES: Mapping[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "qwen2moe": "Qwen2MoeForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "glm4": "Glm4ForCausalLM",
    # V3 when its router is sigmoid (`gguf_deepseek.deepseek2_fields`).
    "deepseek2": "DeepseekV2ForCausalLM",
    "chatglm": "GlmForCausalLM",  # ChatGLM3, GLM-4-9B: `gguf_chatglm`
}
#: A "llama" file with experts (``llama.expert_count``) is Mixtral.
_MIXTRAL = "MixtralForCausalLM"
#: Whether llama.cpp renormalises the top-k router weights when the file has no
#: ``<arch>.expert_weights_norm``: Mixtral always, Qwen2-MoE never, Qwen3-MoE always.
_EXPERT_WEIGHTS_NORM = {"llama": True, "qwen2moe": False, "qwen3moe": True}
_MODEL_TYPES = {
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
_FILE_TYPE_DTYPES = {0: "float32", 1: "float16", 32: "bfloat16"}  # general.file_type
#: Architectures whose norms scale by ``1 + w``: llama.cpp's converter stores ``w + 1``.
OFFSET_NORM_ARCHITECTURES = frozenset(["gemma2", "gemma3"])
#: llama.cpp's Gemma layouts: one layer in this many attends globally, the others within the
#: window; and the layer count of the 27B models, whose query scale is not ``head_dim``.
_GEMMA_SLIDING_WINDOW_PATTERN = {"gemma2": 2, "gemma3": 6}
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
_GEMMA_END_OF_TURN = "<end_of_turn>"


def hf_config_from_gguf(
    meta: Mapping[str, Any],
    tensor_names: Sequence[str],
    rope_factors: Mapping[str, Sequence[float]] | None = None,
) -> dict[str, Any]:
    """A ``config.json``-style dict rebuilt from GGUF metadata (``<arch>.*`` keys) and the
    long-rope factors its tensors hold (`gguf_phi3.rope_factor_lists`)."""
    arch = str(meta.get("general.architecture"))
    if arch not in GGUF_ARCHITECTURES:
        raise UnsupportedModelError(
            f"GGUF architecture {arch!r} is not supported; supported: "
            f"{', '.join(GGUF_ARCHITECTURES)}"
        )

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    if arch == "chatglm":
        gguf_chatglm.check_required_keys(meta)
    architecture = GGUF_ARCHITECTURES[arch]
    if arch == "llama" and get("expert_count"):
        architecture = _MIXTRAL
    num_heads = int(get("attention.head_count"))
    hidden_size = int(get("embedding_length"))
    head_dim = get("attention.key_length") or (
        get("rope.dimension_count") if arch == "llama" else None
    )
    return {
        "architectures": [architecture],
        "model_type": _MODEL_TYPES.get(architecture, arch),
        "vocab_size": int(get("vocab_size") or len(meta["tokenizer.ggml.tokens"])),
        "hidden_size": hidden_size,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(get("attention.head_count_kv", num_heads)),
        "head_dim": int(head_dim) if head_dim else hidden_size // num_heads,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(meta, arch, tensor_names),
        "max_position_embeddings": int(get("context_length")),
        # llama.cpp drops output.weight when the head is tied to the embeddings.
        "tie_word_embeddings": "output.weight" not in tensor_names,
        **_optional_biases(tensor_names),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": _eos_token_ids(meta),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "dtype": _FILE_TYPE_DTYPES.get(int(meta.get("general.file_type", -1))),
        **(_moe_fields(arch, meta, tensor_names) if architecture in _MODEL_TYPES else {}),
        **(
            _gemma_fields(arch, meta, int(head_dim or 0))
            if arch in OFFSET_NORM_ARCHITECTURES
            else {}
        ),
        **(gguf_phi3.phi3_fields(meta, rope_factors or {}) if arch == "phi3" else {}),
        **(gguf_glm4.glm4_fields(meta, int(head_dim or 0)) if arch == "glm4" else {}),
        **(gguf_deepseek.deepseek2_fields(meta, tensor_names) if arch == "deepseek2" else {}),
        **(
            gguf_chatglm.chatglm_fields(meta, tensor_names, _eos_token_ids(meta))
            if arch == "chatglm"
            else {}
        ),
    }


def _gemma_fields(arch: str, meta: Mapping[str, Any], head_dim: int) -> dict[str, Any]:
    """What a Gemma file leaves implicit, as llama.cpp reads it: the window's layout (every
    other layer global in Gemma 2, every sixth in Gemma 3), the query scale (``head_dim``, but
    hidden / heads in the 27B models, whose head_dim is not that), and Gemma 2's caps."""
    scalar = head_dim
    if int(meta[f"{arch}.block_count"]) == _GEMMA_27B_LAYERS[arch]:
        scalar = int(meta[f"{arch}.embedding_length"]) // int(meta[f"{arch}.attention.head_count"])
    tokens = meta["tokenizer.ggml.tokens"]
    end_of_turn = [tokens.index(_GEMMA_END_OF_TURN)] if _GEMMA_END_OF_TURN in tokens else []
    return {
        # Instruction-tuned turns end in <end_of_turn>, which the file does not name as eos
        # (transformers' generation_config.json lists both).
        "eos_token_id": _eos_token_ids(meta) + end_of_turn,
        "sliding_window": int(meta[f"{arch}.attention.sliding_window"]),
        "sliding_window_pattern": _GEMMA_SLIDING_WINDOW_PATTERN[arch],
        "query_pre_attn_scalar": scalar,
        "attn_logit_softcapping": meta.get(f"{arch}.attn_logit_softcapping"),
        "final_logit_softcapping": meta.get(f"{arch}.final_logit_softcapping"),
    }


def _moe_fields(arch: str, meta: Mapping[str, Any], tensor_names: Sequence[str]) -> dict[str, Any]:
    """The mixture-of-experts fields (``ferrollm.models.moe_config``) as llama.cpp reads them.
    Layers without a router (``ffn_gate_inp``) run the dense MLP: Qwen's ``mlp_only_layers``,
    which the file has no key for."""

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    num_layers = int(get("block_count"))
    names = set(tensor_names)
    return {
        "num_experts": int(get("expert_count")),
        "num_experts_per_tok": int(get("expert_used_count")),
        "moe_intermediate_size": get("expert_feed_forward_length"),
        "shared_expert_intermediate_size": get("expert_shared_feed_forward_length"),
        "norm_topk_prob": bool(get("expert_weights_norm", _EXPERT_WEIGHTS_NORM[arch])),
        "mlp_only_layers": [
            i for i in range(num_layers) if f"blk.{i}.ffn_gate_inp.weight" not in names
        ],
    }


def _optional_biases(tensor_names: Sequence[str]) -> dict[str, bool]:
    # GGUF metadata has no bias flags: a Llama's optional biases show only as tensors. (Qwen2's
    # q/k/v bias is implied by its architecture, whatever this says.)
    return {
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "mlp_bias": "blk.0.ffn_gate.bias" in tensor_names,
    }


def _rope_scaling(
    meta: Mapping[str, Any], arch: str, tensor_names: Sequence[str]
) -> dict[str, Any] | None:
    if "rope_freqs.weight" in tensor_names:
        # Llama 3.1+ files store precomputed per-frequency factors instead of the scaling
        # parameters; transformers ignores them too, so parity holds, but long prompts drift.
        logger.warning("GGUF llama3 rope factors (rope_freqs) are not applied")
    rope_type = meta.get(f"{arch}.rope.scaling.type")
    if rope_type in (None, "none"):
        return None
    return {"rope_type": rope_type, "factor": meta.get(f"{arch}.rope.scaling.factor", 1.0)}


def _eos_token_ids(meta: Mapping[str, Any]) -> list[int]:
    # llama.cpp also ends generation at the end-of-turn / end-of-message tokens when named.
    keys = ("eos_token_id", "eot_token_id", "eom_token_id")
    ids = [meta.get(f"tokenizer.ggml.{key}") for key in keys]
    return [int(i) for i in ids if i is not None]
