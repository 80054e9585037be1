"""Llama 3.x JSON tool calls: the message is ``{"name": ..., "parameters": {...}}``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ferrollm.tools.format_base import (
    Function,
    ToolFormat,
    _lark_json,
    _object_call_schema,
    _scan_object,
)
from ferrollm.tools.jsonscan import skip_ws
from ferrollm.tools.stream import CallSnapshot, Snapshot


class Llama3JsonFormat(ToolFormat):
    """Llama 3.x: the whole message is ``{"name": ..., "parameters": {...}}`` (calls joined
    by ``;``); a message that does not open with ``{`` is plain text."""

    name = "llama3_json"
    _ARGS = ("parameters", "arguments")

    def scan(self, text: str, final: bool) -> Snapshot:
        b = skip_ws(text, 0)
        if b == len(text):
            return Snapshot(content=text if final else "")
        if text[b] != "{":
            return Snapshot(content=text)
        snap = Snapshot()
        i = b
        while i < len(text):
            call, end = _scan_object(text, i, final, self._ARGS)
            snap.calls.append(call)
            if end is None:
                break
            i = skip_ws(text, end)
            if i < len(text) and text[i] == ";":
                i = skip_ws(text, i + 1)
            elif i < len(text):
                snap.calls.append(CallSnapshot())  # text after a call: not a call message
                break
        return snap

    def grammar(self, forced: Sequence[Function], free_text: bool, single: bool) -> str:
        call = _lark_json(_object_call_schema(forced, "parameters"))
        many = "" if single else ' ("; " call)*'
        calls = f"start: call{many}\ncall: {call}\n"
        if not free_text:
            return "%llguidance {}\n" + calls
        # Free text is any message whose first visible character is not the call's "{".
        return (
            "%llguidance {}\n"
            f"start: FREE? | call{many}\n"
            "FREE: /[ \\t\\r\\n]*[^{ \\t\\r\\n](?s:.*)/\n"
            f"call: {call}\n"
        )

    def instructions(self) -> str:
        listed = "\n\n".join(json.dumps(f.as_tool(), ensure_ascii=False) for f in self.functions)
        return (
            "You can call functions to answer. To call one, reply with only a JSON object of "
            'the form {"name": "function name", "parameters": {"argument": "value"}}. '
            f"The functions:\n\n{listed}"
        )

    def render_calls(self, calls: Sequence[Mapping[str, Any]]) -> str:
        return "; ".join(
            json.dumps({"name": c["name"], "parameters": c["arguments"]}, ensure_ascii=False)
            for c in calls
        )
