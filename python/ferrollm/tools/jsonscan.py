"""Reading JSON that is still being written: where a value ends (or that it has not ended
yet), and an object's members as spans of the text, so a stream can hand out a tool call's
name once it is whole and its arguments as they grow.

Only spans are computed: the text of a value is always the model's own bytes, so streamed
fragments re-assemble to exactly what a whole-text parse returns."""

from __future__ import annotations

import json
from dataclasses import dataclass

_WS = " \t\r\n"
_SCALAR_END = ",}] \t\r\n;"


class Malformed(ValueError):
    """The text is not (the start of) the JSON expected here."""


def skip_ws(text: str, i: int) -> int:
    """The first index at or after ``i`` that is not JSON whitespace."""
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    return i


def string_end(text: str, i: int) -> int | None:
    """One past the closing quote of the string opening at ``text[i]``, or None if open."""
    n = len(text)
    j = i + 1
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        j += 1
    return None


def value_end(text: str, i: int, *, final: bool = False) -> int | None:
    """One past the end of the JSON value starting at ``text[i]``, or None while it may still
    grow (a scalar that reaches the end of the text ends there when ``final``)."""
    n = len(text)
    if i >= n:
        return None
    c = text[i]
    if c == '"':
        return string_end(text, i)
    if c in "{[":
        depth = 0
        j = i
        while j < n:
            c = text[j]
            if c == '"':
                end = string_end(text, j)
                if end is None:
                    return None
                j = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return None
    if c in _SCALAR_END:
        raise Malformed(f"expected a JSON value at {text[i : i + 10]!r}")
    j = i
    while j < n and text[j] not in _SCALAR_END:
        j += 1
    return j if j < n or final else None


@dataclass
class Member:
    """One member of an object being read: the value's span (``end`` None while open)."""

    start: int
    end: int | None


def object_members(
    text: str, i: int, *, final: bool = False
) -> tuple[dict[str, Member], int | None]:
    """The members of the object opening at ``text[i]`` (``{``) read so far, and one past its
    closing brace (None while open). Raises Malformed for text that cannot become an object."""
    if i >= len(text) or text[i] != "{":
        raise Malformed("expected a JSON object")
    members: dict[str, Member] = {}
    n = len(text)
    i += 1
    expect_key = True
    while True:
        i = skip_ws(text, i)
        if i >= n:
            return members, None
        c = text[i]
        if c == "}":
            return members, i + 1
        if c == ",":
            if expect_key:
                raise Malformed("a comma where a key was expected")
            expect_key = True
            i += 1
            continue
        if c != '"' or not expect_key:
            raise Malformed(f"expected a key at {text[i : i + 10]!r}")
        key_end = string_end(text, i)
        if key_end is None:
            return members, None
        key = json.loads(text[i:key_end])
        i = skip_ws(text, key_end)
        if i >= n:
            return members, None
        if text[i] != ":":
            raise Malformed(f"expected ':' after the key {key!r}")
        i = skip_ws(text, i + 1)
        if i >= n:
            members[key] = Member(i, None)
            return members, None
        end = value_end(text, i, final=final)
        members[key] = Member(i, end)
        if end is None:
            return members, None
        i = end
        expect_key = False
