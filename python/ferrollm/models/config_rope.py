"""Rope parameters of a ``config.json``: where transformers versions put them (``rope_theta``
and ``rope_scaling`` at the top level, or ``rope_parameters``, keyed by layer type where layer
types differ), the scaling types ferrollm implements, and the values long rope and YaRN derive
from the rest of the config. Read by ``ferrollm.models.config``; torch-free."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

from ferrollm.models.config_fields import UnsupportedModelError, float_field, int_field

#: Rope scaling types ferrollm implements; "default" (or no scaling) becomes None.
SUPPORTED_ROPE_TYPES = ("linear", "llama3", "longrope", "yarn")


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
    #: llama3, longrope and yarn: the context the model was pretrained on.
    original_max_position_embeddings: int | None = None
    # longrope only: per-frequency divisors of the inverse frequencies, for contexts up to
    # the original one and past it, and the scale on cos/sin (resolved: never None there).
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    attention_factor: float | None = None
    # yarn only (``attention_factor`` too, resolved): the ramp between interpolated and kept
    # frequencies, whether its ends are rounded, and DeepSeek's softmax scale term.
    beta_fast: float | None = None
    beta_slow: float | None = None
    truncate: bool | None = None
    mscale_all_dim: float | None = None

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


def parameters(config: Mapping[str, Any], layer_type: str) -> Mapping[str, Any]:
    """The rope parameters of ``layer_type`` layers: transformers >= 5 writes
    ``rope_parameters`` (theta inside; keyed by layer type where types differ, as Gemma 3's
    ``full_attention`` / ``sliding_attention``); older ones a flat ``rope_scaling``."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"config.json: `rope_parameters` must be an object; got {params!r}")
    if layer_type in params:
        params = params[layer_type] or {}
        if not isinstance(params, Mapping):
            raise ValueError(
                f"config.json: `rope_parameters.{layer_type}` must be an object; got {params!r}"
            )
    return params


def local_parameters(config: Mapping[str, Any], default_theta: float | None) -> Mapping[str, Any]:
    """The sliding layers' rope: their own entry of ``rope_parameters``, else (older configs,
    whose ``rope_scaling`` is the full layers') plain rope at ``rope_local_base_freq`` (Gemma
    3), or the full layers' rope where the family has one for all (Gemma 2)."""
    params = config.get("rope_parameters") or {}
    if isinstance(params, Mapping) and "sliding_attention" in params:
        return parameters(config, "sliding_attention")
    if default_theta is None:
        return parameters(config, "full_attention")
    return {"rope_theta": config.get("rope_local_base_freq", default_theta)}


def theta(config: Mapping[str, Any], params: Mapping[str, Any]) -> float:
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    return float_field({"rope_theta": theta}, "rope_theta", default=10000.0)


def partial_rotary_factor(config: Mapping[str, Any], params: Mapping[str, Any]) -> float:
    """transformers >= 5 keeps it in ``rope_parameters``, older versions at the top level."""
    key = "partial_rotary_factor"
    value = params.get(key, config.get(key, 1.0))
    factor = float_field({key: value}, key, default=1.0)
    if factor > 1.0:
        raise ValueError(f"config.json: `{key}` must be in (0, 1]; got {value!r}")
    return factor


def scaling(
    params: Mapping[str, Any],
    config: Mapping[str, Any] | None = None,
    max_position_embeddings: int = 0,
    rotary_dim: int = 0,
) -> RopeScaling | None:
    """The scaling of ``params``; ``config`` (top-level keys), ``max_position_embeddings`` and
    ``rotary_dim`` (dims rope turns) are what long rope reads beyond its parameters."""
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "su":  # Phi-3's first name for long rope (transformers renames it too)
        rope_type = "longrope"
    if rope_type == "default":
        return None
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"config.json: rope scaling type {rope_type!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)} (or none)"
        )
    if rope_type == "longrope":
        return _longrope_scaling(params, config or {}, max_position_embeddings, rotary_dim)
    if rope_type == "yarn":
        return _yarn_scaling(params, max_position_embeddings)
    factor = float_field(params, "factor", default=1.0)
    if rope_type == "linear":
        return RopeScaling("linear", factor)
    return RopeScaling(
        "llama3",
        factor,
        low_freq_factor=float_field(params, "low_freq_factor", default=1.0),
        high_freq_factor=float_field(params, "high_freq_factor", default=4.0),
        original_max_position_embeddings=int_field(params, "original_max_position_embeddings"),
    )


def _longrope_scaling(
    params: Mapping[str, Any], config: Mapping[str, Any], max_len: int, rotary_dim: int
) -> RopeScaling:
    """Long rope as transformers' ``_compute_longrope_parameters`` resolves it: ``factor`` is
    the config's or ``max_position_embeddings / original``; the cos/sin scale is the config's
    ``attention_factor`` or ``sqrt(1 + ln(factor) / ln(original))`` (1 when factor <= 1)."""
    key = "original_max_position_embeddings"
    # transformers prefers the top-level key (where Phi-3 saves it) and falls back on the
    # model's own context.
    original = int_field({key: config.get(key) or params.get(key)}, key, default=max_len)
    factor = float_field({"factor": params.get("factor") or max_len / original}, "factor", 1.0)
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return RopeScaling(
        "longrope",
        factor,
        original_max_position_embeddings=original,
        short_factor=_rope_factors(params, "short_factor", rotary_dim),
        long_factor=_rope_factors(params, "long_factor", rotary_dim),
        attention_factor=float_field({"attention_factor": attention}, "attention_factor", 1.0),
    )


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1 * mscale * ln(factor) + 1`` (1 without scaling)."""
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_scaling(params: Mapping[str, Any], max_len: int) -> RopeScaling:
    """YaRN as transformers' ``_compute_yarn_parameters`` resolves it: ``factor`` defaults to
    ``max_position_embeddings / original``; the cos/sin scale is the config's
    ``attention_factor``, else ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)``
    when both are set, else ``mscale(factor)``."""
    key = "original_max_position_embeddings"
    original = int_field(params, key)
    factor = float_field({"factor": params.get("factor") or max_len / original}, "factor", 1.0)
    mscale, all_dim = params.get("mscale"), params.get("mscale_all_dim")
    attention = params.get("attention_factor")
    if attention is None:
        attention = (
            yarn_mscale(factor, float(mscale)) / yarn_mscale(factor, float(all_dim))
            if mscale and all_dim
            else yarn_mscale(factor)
        )
    return RopeScaling(
        "yarn",
        factor,
        original_max_position_embeddings=original,
        attention_factor=float_field({"attention_factor": attention}, "attention_factor", 1.0),
        beta_fast=float(params.get("beta_fast") or 32),
        beta_slow=float(params.get("beta_slow") or 1),
        truncate=bool(params.get("truncate", True)),
        mscale_all_dim=float(all_dim) if all_dim else None,
    )


def _rope_factors(params: Mapping[str, Any], key: str, rotary_dim: int) -> tuple[float, ...]:
    value = params.get(key)
    ok = isinstance(value, list) and len(value) == rotary_dim // 2
    if not ok or not all(isinstance(v, (int, float)) and v > 0 for v in value):  # type: ignore[union-attr]
        raise ValueError(
            f"config.json: `rope_scaling.{key}` must list {rotary_dim // 2} positive numbers "
            f"(one per rotated frequency); got {value!r}"
        )
    return tuple(float(v) for v in value)  # type: ignore[union-attr]
