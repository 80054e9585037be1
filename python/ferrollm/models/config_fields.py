"""Reading typed fields out of a ``config.json`` dict, with errors that name the field.

Shared by ``ModelConfig`` and the family-specific parameters (``gemma_config`` ...); torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class UnsupportedModelError(ValueError):
    """A checkpoint names an architecture (or a feature of one) that ferrollm cannot run."""


def int_field(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key)
    if value is None:
        if default is None:
            raise ValueError(f"config.json: `{key}` is missing")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"config.json: `{key}` must be a positive integer; got {value!r}")
    return value


def optional_int_field(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, list):  # some configs list several bos/pad ids; the first is canonical
        value = value[0] if value else None
        return None if value is None else int(value)
    return int(value)


def float_field(config: Mapping[str, Any], key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"config.json: `{key}` must be a positive number; got {value!r}")
    return float(value)


def positive_int(raw: Mapping[str, Any], key: str, where: str, default: Any = None) -> int:
    """``raw[key]`` (else ``default``) as a positive int; UnsupportedModelError naming
    ``{where}{key}`` (a nested config's path, e.g. ``vision_config.``) otherwise."""
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UnsupportedModelError(
            f"config.json: `{where}{key}` must be a positive integer; got {value!r}"
        )
    return value


def positive_float(raw: Mapping[str, Any], key: str, where: str, default: float) -> float:
    """``raw[key]`` (else ``default``) as a positive float; UnsupportedModelError naming
    ``{where}{key}`` otherwise."""
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise UnsupportedModelError(
            f"config.json: `{where}{key}` must be a positive number; got {value!r}"
        )
    return float(value)
