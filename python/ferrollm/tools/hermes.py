"""Hermes / Qwen2.5 tool calls: ``<tool_call>{json}</tool_call>`` blocks."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ferrollm.tools.format_base import (
    Function,
    ToolFormat,
    _hold_marker_prefix,
    _lark_json,
    _object_call_schema,
    _scan_object,
)
from ferrollm.tools.jsonscan import skip_ws
from ferrollm.tools.stream import CallSnapshot, Snapshot


class HermesFormat(ToolFormat):
    """Hermes / Qwen2.5: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
    one block per call, free text allowed before them."""

    name = "hermes"
    OPEN = "<tool_call>"
    CLOSE = "</tool_call>"
    _ARGS = ("arguments", "parameters")

    def scan(self, text: str, final: bool) -> Snapshot:
        snap = Snapshot()
        content: list[str] = []
        pos = 0
        while True:
            i = text.find(self.OPEN, pos)
            segment = text[pos:] if i < 0 else text[pos:i]
            if i < 0 and not final:
                segment = segment[: len(segment) - _hold_marker_prefix(segment, self.OPEN)]
            # Between and after calls only text with something in it is content.
            if not snap.calls or segment.strip():
                content.append(segment)
            if i < 0:
                break
            start = i + len(self.OPEN)
            close = text.find(self.CLOSE, start)
            body = text[start:] if close < 0 else text[start:close]
            b = skip_ws(body, 0)
            if b < len(body):
                call, _ = _scan_object(body, b, final or close >= 0, self._ARGS)
                call.done = call.done and close >= 0
            else:
                call = CallSnapshot()
            snap.calls.append(call)
            if close < 0:
                break
            pos = close + len(self.CLOSE)
        snap.content = "".join(content)
        return snap

    def _call_rule(self, forced: Sequence[Function]) -> str:
        return f'"\\n" {_lark_json(_object_call_schema(forced, "arguments"))} "\\n</tool_call>"'

    def grammar(self, forced: Sequence[Function], free_text: bool, single: bool) -> str:
        body = self._call_rule(forced)
        many = "" if single else ' ("\\n" call)*'
        rules = f'call: "<tool_call>" call_body\ncall_body: {body}\n'
        if not free_text:
            return f"%llguidance {{}}\nstart: call{many}\n{rules}"
        # Free text is any text without the marker; the lazy `lead` ends at the first marker,
        # after which only calls may follow.
        return (
            "%llguidance {}\n"
            f"start: FREE | lead call_body{many}\n"
            "FREE: ~/(?s:.*)<tool_call>(?s:.*)/\n"
            "lead[lazy]: /(?s:.*)<tool_call>/\n"
            f"{rules}"
        )

    def instructions(self) -> str:
        listed = "\n".join(json.dumps(f.as_tool(), ensure_ascii=False) for f in self.functions)
        return (
            "You can call functions to answer. Each function is described by a JSON schema "
            f"inside <tools></tools>:\n<tools>\n{listed}\n</tools>\n"
            "To call one, reply with a JSON object naming the function and giving its "
            "arguments, inside <tool_call></tool_call> tags, one block per call:\n"
            '<tool_call>\n{"name": "function name", "arguments": {"argument": "value"}}\n'
            "</tool_call>"
        )

    def render_calls(self, calls: Sequence[Mapping[str, Any]]) -> str:
        blocks = (
            json.dumps({"name": c["name"], "arguments": c["arguments"]}, ensure_ascii=False)
            for c in calls
        )
        return "\n".join(f"<tool_call>\n{block}\n</tool_call>" for block in blocks)

    def render_result(self, content: str) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"
