"""Mistral tool calls: ``[TOOL_CALLS][{...}, ...]``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ferrollm.tools.format_base import (
    Function,
    ToolFormat,
    _hold_marker_prefix,
    _lark_json,
    _lark_string,
    _object_call_schema,
    _scan_object,
)
from ferrollm.tools.jsonscan import skip_ws
from ferrollm.tools.stream import CallSnapshot, Snapshot


class MistralFormat(ToolFormat):
    """Mistral (v3 tokenizers): ``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"}``
    objects. The marker is a special token there, kept in the text for this parser."""

    name = "mistral"
    keeps_special_tokens = True
    MARKER = "[TOOL_CALLS]"
    _ARGS = ("arguments", "parameters")

    def scan(self, text: str, final: bool) -> Snapshot:
        i = text.find(self.MARKER)
        if i < 0:
            held = 0 if final else _hold_marker_prefix(text, self.MARKER)
            return Snapshot(content=text[: len(text) - held])
        snap = Snapshot(content=text[:i])
        j = skip_ws(text, i + len(self.MARKER))
        if j >= len(text):
            return snap
        if text[j] != "[":
            snap.calls.append(CallSnapshot())
            return snap
        j += 1
        while True:
            j = skip_ws(text, j)
            if j >= len(text) or text[j] == "]":
                return snap
            if text[j] == ",":
                j += 1
                continue
            call, end = _scan_object(text, j, final, self._ARGS)
            snap.calls.append(call)
            if end is None:
                return snap
            j = end

    def _marker(self) -> str:
        if self.marker_token is not None:
            return f"<[{self.marker_token}]>"
        return _lark_string(self.MARKER)

    def grammar(self, forced: Sequence[Function], free_text: bool, single: bool) -> str:
        item = _object_call_schema(forced, "arguments")
        array = {"type": "array", "items": item, "minItems": 1}
        if single:
            array["maxItems"] = 1
        calls = f"{self._marker()} {_lark_json(array)}"
        if not free_text:
            return f"%llguidance {{}}\nstart: {calls}\n"
        if self.marker_token is not None:  # free text cannot spell a special token
            return f"%llguidance {{}}\nstart: TEXT? | TEXT? {calls}\nTEXT: /(?s:.+)/\n"
        return (
            "%llguidance {}\n"
            f"start: FREE | lead {_lark_json(array)}\n"
            "FREE: ~/(?s:.*)\\[TOOL_CALLS\\](?s:.*)/\n"
            "lead[lazy]: /(?s:.*)\\[TOOL_CALLS\\]/\n"
        )

    def instructions(self) -> str:
        listed = json.dumps([f.as_tool() for f in self.functions], ensure_ascii=False)
        return (
            f"[AVAILABLE_TOOLS] {listed} [/AVAILABLE_TOOLS] To call functions, reply with "
            f'{self.MARKER} and a JSON list of {{"name": ..., "arguments": {{...}}}} objects.'
        )

    def render_calls(self, calls: Sequence[Mapping[str, Any]]) -> str:
        items = [{"name": c["name"], "arguments": c["arguments"]} for c in calls]
        return self.MARKER + json.dumps(items, ensure_ascii=False)
