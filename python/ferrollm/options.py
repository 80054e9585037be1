"""What every options module shares and imports nothing of the package: the one error an
option raises (`EngineConfigError`, naming it), the byte-size and positive-integer rules, and
reading a JSON options file."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import Any

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(|b|[kmgt]i?b?)\s*$", re.IGNORECASE)
# Binary multiples for KiB/K, decimal for KB, as `free`, docker and vLLM read them.
_UNIT = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_DECIMAL_UNIT = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


class EngineConfigError(ValueError):
    """An engine option broke its rule; ``field`` names the option."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def parse_bytes(value: int | str, field: str = "kv_cache_memory", *, zero: bool = False) -> int:
    """Bytes from an int or a size string: "4GiB", "4G" and "4096MiB" are binary, "4GB" decimal.

    Raises EngineConfigError naming ``field`` unless the result is positive (or, with
    ``zero``, 0).
    """
    least = 0 if zero else 1
    if isinstance(value, bool):
        raise _bad_size(value, field, zero)
    if isinstance(value, int):
        if value < least:
            raise _bad_size(value, field, zero)
        return value
    match = _SIZE.match(str(value))
    if match is None:
        raise _bad_size(value, field, zero)
    number, unit = float(match[1]), match[2].lower()
    scale = _DECIMAL_UNIT.get(unit) or _UNIT[unit[:1]]
    result = int(number * scale)
    if result < least:
        raise _bad_size(value, field, zero)
    return result


def _bad_size(value: object, field: str, zero: bool) -> EngineConfigError:
    kind = "a non-negative" if zero else "a positive"
    return EngineConfigError(
        field,
        f"`{field}` must be {kind} number of bytes or a size like '4GiB' or '512MB'; got {value!r}",
    )


def positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise EngineConfigError(name, f"`{name}` must be a positive integer; got {value!r}")


def one_of(name: str, value: object, choices: Sequence[object]) -> None:
    """EngineConfigError naming option ``name`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        listed = ", ".join(str(c) for c in choices)
        raise EngineConfigError(name, f"`{name}` must be one of {listed}; got {value!r}")


def read_options_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object of options in the file at ``path``."""
    try:
        with open(path, encoding="utf-8") as f:
            options = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise EngineConfigError(
            "config", f"cannot read config file {os.fspath(path)!r}: {e}"
        ) from None
    if not isinstance(options, dict):
        raise EngineConfigError("config", f"{os.fspath(path)!r} must hold a JSON object of options")
    return options
