"""`ModelConfig`: the validated, normalised shape of a Llama-family checkpoint.

Built from a Hugging Face ``config.json`` dict (plus ``generation_config.json``), whichever
transformers version wrote it: ``rope_theta`` and ``rope_scaling`` are read from the old top-level
keys or from the newer ``rope_parameters``; family facts that a config leaves implicit (Qwen2's
q/k/v bias, Qwen3's q/k norm and head size) come from the architecture, not the dict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ferrollm.models import config_rope as rope
from ferrollm.models.config_fields import (
    UnsupportedModelError as UnsupportedModelError,  # re-exported: where callers look
)
from ferrollm.models.config_fields import (
    float_field,
    int_field,
    optional_int_field,
)
from ferrollm.models.config_rope import SUPPORTED_ROPE_TYPES as SUPPORTED_ROPE_TYPES
from ferrollm.models.config_rope import RopeScaling as RopeScaling
from ferrollm.models.config_rope import yarn_mscale as yarn_mscale
from ferrollm.models.deepseek_config import (
    DeepseekMoeParams,
    MlaParams,
    deepseek_moe_params,
    mla_params,
)
from ferrollm.models.glm_config import GLM_MODEL_TYPES, glm_dialect
from ferrollm.models.moe_config import MoeParams, moe_params


@dataclass(frozen=True)
class ArchitectureInfo:
    """What an architecture implies beyond its config.json.

    ``qkv_bias`` / ``o_proj_bias``: None means "as the config's ``attention_bias`` says";
    ``mlp_bias``: None means "as the config's ``mlp_bias`` says".
    """

    model_type: str
    qkv_bias: bool | None
    o_proj_bias: bool | None
    mlp_bias: bool | None
    qk_norm: bool
    #: transformers' defaults, used when config.json omits the key.
    default_max_position_embeddings: int
    default_head_dim: int | None  # None: hidden_size // num_attention_heads
    #: MLP activations it runs (``hidden_act``, or Gemma's ``hidden_activation``).
    activations: tuple[str, ...] = ("silu",)
    #: transformers' default ``sliding_window`` when a family's config.json omits it; set for
    #: the families that interleave sliding and full layers (Gemma), with their defaults: one
    #: full layer in ``sliding_window_pattern``, and the sliding layers' rope base (None: the
    #: full layers' rope).
    default_sliding_window: int | None = None
    sliding_window_pattern: int = 6
    local_rope_theta: float | None = 10000.0
    #: Rope turns only the first ``partial_rotary_factor`` of each head's dims (Phi-4-mini).
    partial_rotary: bool = False


#: Every architecture (``config.json`` ``architectures``) ferrollm runs: the one list of them.
#: ``ferrollm.models.registry`` maps each to its model class. SmolLM2 is a LlamaForCausalLM
#: with tied embeddings.
SUPPORTED_ARCHITECTURES: Mapping[str, ArchitectureInfo] = MappingProxyType(
    {
        "LlamaForCausalLM": ArchitectureInfo("llama", None, None, None, False, 2048, None),
        "MistralForCausalLM": ArchitectureInfo("mistral", False, False, False, False, 131072, None),
        "Qwen2ForCausalLM": ArchitectureInfo("qwen2", True, False, False, False, 32768, None),
        "Qwen3ForCausalLM": ArchitectureInfo("qwen3", None, None, False, True, 32768, 128),
        # Gemma 3 text: (1 + w) norms around both blocks, sqrt(hidden)-scaled embeddings,
        # q/k norm, interleaved sliding and full layers with their own rope (models/gemma.py).
        "Gemma3ForCausalLM": ArchitectureInfo(
            "gemma3_text", None, None, False, True, 131072, 256, ("gelu_pytorch_tanh",), 4096
        ),
        # Gemma 2: Gemma 3's layer without q/k norm, every other layer sliding, one rope,
        # attention scores and logits soft-capped.
        "Gemma2ForCausalLM": ArchitectureInfo(
            "gemma2", None, None, False, False, 8192, 256, ("gelu_pytorch_tanh",), 4096, 2, None
        ),
        # Mixture of experts (models/moe.py): Mistral/Qwen2/Qwen3 attention, routed experts.
        "MixtralForCausalLM": ArchitectureInfo("mixtral", False, False, False, False, 131072, None),
        "Qwen2MoeForCausalLM": ArchitectureInfo(
            "qwen2_moe", True, False, False, False, 32768, None
        ),
        "Qwen3MoeForCausalLM": ArchitectureInfo("qwen3_moe", None, None, False, True, 32768, None),
        # GLM-4 (models/glm.py): q/k/v bias, partial rotary in interleaved pairs, fused
        # gate/up; Glm4 adds a norm after each block; ChatGLM3 / GLM-4's original checkpoints
        # are GLM under other config keys and tensor names (models/glm_config.py).
        "GlmForCausalLM": ArchitectureInfo(
            "glm", None, False, False, False, 131072, 128, partial_rotary=True
        ),
        "Glm4ForCausalLM": ArchitectureInfo(
            "glm4", None, False, False, False, 131072, 128, partial_rotary=True
        ),
        "ChatGLMModel": ArchitectureInfo(
            "chatglm", None, False, False, False, 8192, None, partial_rotary=True
        ),
        "ChatGLMForConditionalGeneration": ArchitectureInfo(
            "chatglm", None, False, False, False, 8192, None, partial_rotary=True
        ),
        # Phi-3 and Phi-4: fused qkv/gate_up checkpoints, long rope, partial rotary
        # (models/phi3.py).
        "Phi3ForCausalLM": ArchitectureInfo(
            "phi3", False, False, False, False, 4096, None, partial_rotary=True
        ),
        # DeepSeek-V2/V3 (models/deepseek.py): multi-head latent attention over a cache of the
        # compressed latent, YaRN rope; grouped routing to experts plus shared experts.
        "DeepseekV2ForCausalLM": ArchitectureInfo(
            "deepseek_v2", None, None, False, False, 2048, None
        ),
        "DeepseekV3ForCausalLM": ArchitectureInfo(
            "deepseek_v3", None, None, False, False, 4096, None
        ),
    }
)


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only Llama-family model's shape, as the model and the engine need it."""

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    #: q/k/v projections carry a bias (Qwen2 always; Llama/Qwen3 when config says so).
    attention_bias: bool
    #: o_proj carries a bias (Llama/Qwen3 with attention_bias; never Qwen2/Mistral).
    o_proj_bias: bool
    #: gate/up/down projections carry a bias (Llama when config says so; no other family).
    mlp_bias: bool
    #: per-head RMSNorm on q and k before rope (Qwen3).
    qk_norm: bool
    #: Mistral-style window over the last ``sliding_window`` keys, or None for full attention.
    sliding_window: int | None
    bos_token_id: int | None
    #: every id that ends generation: config.json's eos merged with generation_config.json's.
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    #: the checkpoint's own float dtype name ("bfloat16", ...), None when unknown or quantized.
    dtype: str | None
    #: the MLP's activation (a key of ``ferrollm.layers.activation.ACTIVATIONS``).
    hidden_act: str = "silu"
    #: each layer's attention window (None: full) where layers differ (Gemma's interleave);
    #: None when every layer uses ``sliding_window``.
    layer_windows: tuple[int | None, ...] | None = None
    #: the rope of the windowed layers of ``layer_windows`` (Gemma's local base frequency).
    local_rope_theta: float | None = None
    local_rope_scaling: RopeScaling | None = None
    #: attention scale ``query_pre_attn_scalar ** -0.5`` (Gemma); None: ``head_dim ** -0.5``.
    query_pre_attn_scalar: float | None = None
    #: logits become ``cap * tanh(logits / cap)`` (Gemma 2 and some Gemma 3 configs).
    final_logit_softcapping: float | None = None
    #: attention scores capped the same way before the softmax (Gemma 2).
    attn_logit_softcapping: float | None = None
    #: the sparse MLP layers' experts and routing (Mixtral, Qwen MoE); None for dense models.
    moe: MoeParams | None = None
    #: the share of each head's dims that rope turns, from its start (GLM: 0.5, Phi-4-mini:
    #: 0.75); the rest pass through.
    partial_rotary_factor: float = 1.0
    #: multi-head latent attention's sizes (DeepSeek-V2/V3; ``head_dim`` is then the query
    #: and key heads' ``qk_nope_head_dim + qk_rope_head_dim``); None for other families.
    mla: MlaParams | None = None
    #: DeepSeek's router, experts and shared experts; None for other families.
    deepseek_moe: DeepseekMoeParams | None = None

    @property
    def num_queries_per_kv(self) -> int:
        """Query heads sharing one KV head (grouped-query attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf_dict(
        cls, config: Mapping[str, Any], generation_config: Mapping[str, Any] | None = None
    ) -> ModelConfig:
        """Validate and normalise a ``config.json`` dict (and ``generation_config.json``'s).

        Raises UnsupportedModelError for an unknown architecture or rope type, and ValueError
        naming the field for a missing or malformed value.
        """
        architecture = _architecture(config)
        info = SUPPORTED_ARCHITECTURES[architecture]
        if info.model_type in GLM_MODEL_TYPES:
            config = glm_dialect(config, info.model_type)
        hidden_size = int_field(config, "hidden_size")
        num_heads = int_field(config, "num_attention_heads")
        num_kv_heads = int_field(config, "num_key_value_heads", default=num_heads)
        _check_heads(num_heads, num_kv_heads)
        attention_bias, o_proj_bias, mlp_bias = _biases(config, info)
        num_layers = int_field(config, "num_hidden_layers")
        layer_windows = _layer_windows(config, info, num_layers)
        local_rope = rope.local_parameters(config, info.local_rope_theta) if layer_windows else None
        head_dim = int_field(
            config, "head_dim", default=info.default_head_dim or hidden_size // num_heads
        )
        full_rope = rope.parameters(config, "full_attention")
        partial = rope.partial_rotary_factor(config, full_rope) if info.partial_rotary else 1.0
        mla = mla_params(config, info.model_type)
        rotary_dim = int(head_dim * partial)
        if mla is not None:  # config.json's head_dim is the rope part (transformers sets it)
            head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
            rotary_dim = mla.qk_rope_head_dim
        max_len = int_field(
            config, "max_position_embeddings", default=info.default_max_position_embeddings
        )
        return cls(
            architecture=architecture,
            model_type=info.model_type,
            vocab_size=int_field(config, "vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=int_field(config, "intermediate_size"),
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float_field(config, "rms_norm_eps", default=1e-6),
            rope_theta=rope.theta(config, full_rope),
            rope_scaling=rope.scaling(full_rope, config, max_len, rotary_dim),
            max_position_embeddings=max_len,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            o_proj_bias=o_proj_bias,
            mlp_bias=mlp_bias,
            qk_norm=info.qk_norm,
            sliding_window=None if layer_windows else _sliding_window(config, info.model_type),
            bos_token_id=optional_int_field(config, "bos_token_id"),
            eos_token_ids=_eos_token_ids(config, generation_config or {}),
            pad_token_id=optional_int_field(config, "pad_token_id"),
            dtype=_dtype_name(config),
            hidden_act=_activation(config, info),
            layer_windows=layer_windows,
            local_rope_theta=None if local_rope is None else rope.theta({}, local_rope),
            local_rope_scaling=None if local_rope is None else rope.scaling(local_rope),
            query_pre_attn_scalar=_optional_float(config, "query_pre_attn_scalar"),
            final_logit_softcapping=_optional_float(config, "final_logit_softcapping"),
            attn_logit_softcapping=_optional_float(config, "attn_logit_softcapping"),
            moe=moe_params(config, info.model_type, num_layers),
            partial_rotary_factor=partial,
            mla=mla,
            deepseek_moe=deepseek_moe_params(config, info.model_type),
        )


def _architecture(config: Mapping[str, Any]) -> str:
    names = config.get("architectures") or []
    if not names:
        # Old or hand-written configs: fall back on model_type.
        by_type = {info.model_type: name for name, info in SUPPORTED_ARCHITECTURES.items()}
        names = [
            by_type.get(str(config.get("model_type")), f"model_type={config.get('model_type')}")
        ]
    return resolve_architecture(names)


def resolve_architecture(names: str | Sequence[str]) -> str:
    """The first of ``names`` (config.json's ``architectures``) that ferrollm runs.

    Raises UnsupportedModelError naming what was given and listing every supported name.
    """
    names = [names] if isinstance(names, str) else [str(name) for name in names]
    for name in names:
        if name in SUPPORTED_ARCHITECTURES:
            return name
    raise UnsupportedModelError(
        f"architecture {', '.join(map(repr, names)) or '(none given)'} is not supported; "
        f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def _biases(config: Mapping[str, Any], info: ArchitectureInfo) -> tuple[bool, bool, bool]:
    """(q/k/v, o_proj, MLP) biases: what the architecture fixes, else what config.json says."""
    attention_bias = bool(config.get("attention_bias", False))
    mlp_bias = bool(config.get("mlp_bias", False))
    return (
        attention_bias if info.qkv_bias is None else info.qkv_bias,
        attention_bias if info.o_proj_bias is None else info.o_proj_bias,
        mlp_bias if info.mlp_bias is None else info.mlp_bias,
    )


def _check_heads(num_heads: int, num_kv_heads: int) -> None:
    if num_heads % num_kv_heads:
        raise ValueError(
            f"config.json: `num_attention_heads` ({num_heads}) must be a multiple of "
            f"`num_key_value_heads` ({num_kv_heads})"
        )


def _activation(config: Mapping[str, Any], info: ArchitectureInfo) -> str:
    act = config.get("hidden_activation") or config.get("hidden_act") or info.activations[0]
    if act not in info.activations:
        raise UnsupportedModelError(
            f"config.json: `hidden_act` must be {' or '.join(map(repr, info.activations))} "
            f"for {info.model_type}; got {act!r}"
        )
    return str(act)


def _optional_float(config: Mapping[str, Any], key: str) -> float | None:
    return None if config.get(key) is None else float_field(config, key, default=1.0)


def _layer_windows(
    config: Mapping[str, Any], info: ArchitectureInfo, num_layers: int
) -> tuple[int | None, ...] | None:
    """Per-layer windows of a family that interleaves sliding and full layers (Gemma), from
    ``layer_types`` or the older ``sliding_window_pattern`` (every n-th layer full); None
    for the other families."""
    if info.default_sliding_window is None:
        return None
    window = int_field(config, "sliding_window", default=info.default_sliding_window)
    types = config.get("layer_types")
    if types is None:
        pattern = int_field(config, "sliding_window_pattern", default=info.sliding_window_pattern)
        types = [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(num_layers)
        ]
    if not isinstance(types, list) or len(types) != num_layers:
        raise ValueError(
            f"config.json: `layer_types` must list one type per layer ({num_layers}); got {types!r}"
        )
    known = {"full_attention": None, "sliding_attention": window}
    unknown = sorted({str(t) for t in types} - set(known))
    if unknown:
        raise UnsupportedModelError(
            f"config.json: `layer_types` {unknown} are not supported; "
            "supported: full_attention, sliding_attention"
        )
    return tuple(known[t] for t in types)


def _sliding_window(config: Mapping[str, Any], model_type: str) -> int | None:
    window = config.get("sliding_window")
    if model_type in ("mistral", "mixtral", "phi3"):
        return None if window is None else int(window)
    if (
        model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")
        and config.get("use_sliding_window")
        and window
    ):
        # Qwen's window applies only from layer `max_window_layers` on: not implemented.
        raise UnsupportedModelError("config.json: `use_sliding_window` true is not supported")
    return None


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def _eos_token_ids(
    config: Mapping[str, Any], generation_config: Mapping[str, Any]
) -> tuple[int, ...]:
    merged = _ids(config.get("eos_token_id")) + _ids(generation_config.get("eos_token_id"))
    return tuple(dict.fromkeys(merged))  # dedupe, keep first-seen order


def _dtype_name(config: Mapping[str, Any]) -> str | None:
    name = config.get("dtype", config.get("torch_dtype"))
    return None if name is None else str(name)
