"""Duplicate JSON keys: a body whose object names a key twice is refused (400 naming the key).

JSON (RFC 8259) leaves duplicate names undefined: parsers keep the first, the last, or fail, so
a proxy or a gateway in front of the server may read a different request than the server
would. msgspec keeps the last one silently; the server refuses the body instead, on every JSON
route (`decode_body` is their one way in). The scan is a second parse of a body msgspec already
accepted, by the C scanner of the standard library, building nothing but the keys of each
object (numbers are not converted).
"""

from __future__ import annotations

import json


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _pairs(pairs: list[tuple[str, object]]) -> None:
    if len(pairs) > 1:
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Duplicate(key)
            seen.add(key)


def _skip(_: str) -> None:
    return None


def duplicate_key(body: bytes) -> str | None:
    """The first key that an object of ``body`` (valid JSON) names twice, or None.
    Raises RecursionError for a body nested past the interpreter's recursion limit."""
    try:
        json.loads(body, object_pairs_hook=_pairs, parse_int=_skip, parse_float=_skip)
    except _Duplicate as e:
        return e.key
    return None
