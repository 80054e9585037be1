"""`ModelConfig`: the validated, normalised shape of a Llama-family checkpoint.

Built from a Hugging Face ``config.json`` dict (plus ``generation_config.json``), whichever
transformers version wrote it: ``rope_theta`` and ``rope_scaling`` are read from the old top-level
keys or from the newer ``rope_parameters``; family facts that a config leaves implicit (Qwen2's
q/k/v bias, Qwen3's q/k norm and head size) come from the architecture, not the dict.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any


class UnsupportedModelError(ValueError):
    """A checkpoint names an architecture (or a feature of one) that ferrollm cannot run."""


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


#: Every architecture (``config.json`` ``architectures``) ferrollm runs: the one list of them.
#: ``ferrollm.models.registry`` maps each to its model class. SmolLM2 is a LlamaForCausalLM
#: with tied embeddings.
SUPPORTED_ARCHITECTURES: Mapping[str, ArchitectureInfo] = MappingProxyType(
    {
        "LlamaForCausalLM": ArchitectureInfo("llama", None, None, None, False, 2048, None),
        "MistralForCausalLM": ArchitectureInfo("mistral", False, False, False, False, 131072, None),
        "Qwen2ForCausalLM": ArchitectureInfo("qwen2", True, False, False, False, 32768, None),
        "Qwen3ForCausalLM": ArchitectureInfo("qwen3", None, None, False, True, 32768, 128),
    }
)

#: Rope scaling types ferrollm implements; "default" (or no scaling) becomes None.
SUPPORTED_ROPE_TYPES = ("linear", "llama3")


@dataclass(frozen=True)
class RopeScaling(Mapping[str, Any]):
    """Normalised rope scaling; also a read-only mapping of its set fields.

    The mapping view (``scaling["factor"]``, ``scaling.get("rope_type")``) matches the shape of
    transformers' ``rope_scaling`` dict, so code written against either works.
    """

    rope_type: str
    factor: float
    # llama3 only:
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    def __getitem__(self, key: str) -> Any:
        value = getattr(self, key, None) if key in self._names() else None
        if value is None:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return (name for name in self._names() if getattr(self, name) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


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
        hidden_size = _int(config, "hidden_size")
        num_heads = _int(config, "num_attention_heads")
        num_kv_heads = _int(config, "num_key_value_heads", default=num_heads)
        _check_heads(num_heads, num_kv_heads)
        _check_activation(config)
        attention_bias, o_proj_bias, mlp_bias = _biases(config, info)
        return cls(
            architecture=architecture,
            model_type=info.model_type,
            vocab_size=_int(config, "vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=_int(config, "intermediate_size"),
            num_hidden_layers=_int(config, "num_hidden_layers"),
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=_int(
                config, "head_dim", default=info.default_head_dim or hidden_size // num_heads
            ),
            rms_norm_eps=_float(config, "rms_norm_eps", default=1e-6),
            rope_theta=_rope_theta(config),
            rope_scaling=_rope_scaling(config),
            max_position_embeddings=_int(
                config, "max_position_embeddings", default=info.default_max_position_embeddings
            ),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            o_proj_bias=o_proj_bias,
            mlp_bias=mlp_bias,
            qk_norm=info.qk_norm,
            sliding_window=_sliding_window(config, info.model_type),
            bos_token_id=_optional_int(config, "bos_token_id"),
            eos_token_ids=_eos_token_ids(config, generation_config or {}),
            pad_token_id=_optional_int(config, "pad_token_id"),
            dtype=_dtype_name(config),
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


def _int(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key)
    if value is None:
        if default is None:
            raise ValueError(f"config.json: `{key}` is missing")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"config.json: `{key}` must be a positive integer; got {value!r}")
    return value


def _optional_int(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, list):  # some configs list several bos/pad ids; the first is canonical
        value = value[0] if value else None
        return None if value is None else int(value)
    return int(value)


def _float(config: Mapping[str, Any], key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"config.json: `{key}` must be a positive number; got {value!r}")
    return float(value)


def _check_heads(num_heads: int, num_kv_heads: int) -> None:
    if num_heads % num_kv_heads:
        raise ValueError(
            f"config.json: `num_attention_heads` ({num_heads}) must be a multiple of "
            f"`num_key_value_heads` ({num_kv_heads})"
        )


def _check_activation(config: Mapping[str, Any]) -> None:
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"config.json: `hidden_act` must be 'silu'; got {act!r}")


def _rope_parameters(config: Mapping[str, Any]) -> Mapping[str, Any]:
    # transformers >= 5 writes `rope_parameters` (theta inside); older ones `rope_scaling`.
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"config.json: `rope_parameters` must be an object; got {params!r}")
    return params


def _rope_theta(config: Mapping[str, Any]) -> float:
    theta = config.get("rope_theta", _rope_parameters(config).get("rope_theta", 10000.0))
    return _float({"rope_theta": theta}, "rope_theta", default=10000.0)


def _rope_scaling(config: Mapping[str, Any]) -> RopeScaling | None:
    params = _rope_parameters(config)
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "default":
        return None
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"config.json: rope scaling type {rope_type!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)} (or none)"
        )
    factor = _float(params, "factor", default=1.0)
    if rope_type == "linear":
        return RopeScaling("linear", factor)
    return RopeScaling(
        "llama3",
        factor,
        low_freq_factor=_float(params, "low_freq_factor", default=1.0),
        high_freq_factor=_float(params, "high_freq_factor", default=4.0),
        original_max_position_embeddings=_int(params, "original_max_position_embeddings"),
    )


def _sliding_window(config: Mapping[str, Any], model_type: str) -> int | None:
    window = config.get("sliding_window")
    if model_type == "mistral":
        return None if window is None else int(window)
    if model_type in ("qwen2", "qwen3") and config.get("use_sliding_window") and window:
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
