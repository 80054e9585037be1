"""ChatGLM3 tool calls: the function name on the first line, then ``tool_call(key=value, ...)``
in a Python code block."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ferrollm.tools.format_base import (
    Function,
    ToolFormat,
    _lark_json,
    _lark_string,
)
from ferrollm.tools.stream import CallSnapshot, Snapshot


class ChatGLM3Format(ToolFormat):
    """ChatGLM3 (the family MindIE documents): the function name alone on the first line, then
    ``tool_call(key=value, ...)`` in a Python code block; arguments become a JSON object. A
    plain reply leaves the first line empty (ChatGLM3's empty metadata)."""

    name = "chatglm3"
    _CALL = re.compile(r"```python\s*\ntool_call\((?P<args>.*)\)\s*\n```", re.DOTALL)

    def scan(self, text: str, final: bool) -> Snapshot:
        nl = text.find("\n")
        first = (text if nl < 0 else text[:nl]).strip()
        if nl < 0 and not final and any(n.startswith(first) for n in self.names):
            return Snapshot()  # could still be a function name
        if first not in self.names:
            # A plain reply's first line (the function-name slot) is empty.
            return Snapshot(content=text[1:] if text.startswith("\n") else text)
        call = CallSnapshot(name=first)
        match = self._CALL.search(text, nl + 1) if nl >= 0 else None
        if match is not None:
            call.arguments = _python_kwargs_json(match.group("args"))
            call.done = True
        return Snapshot(calls=[call])

    def _call_rule(self, f: Function) -> str:
        schema = f.call_schema()
        props: Mapping[str, Any] = schema.get("properties") or {}
        required = [k for k in schema.get("required") or [] if k in props]
        parts = ' ", " '.join(f"{_lark_string(k + '=')} {_lark_json(props[k])}" for k in required)
        head = _lark_string(f"{f.name}\n```python\ntool_call(")
        return f"{head} {parts or ''} {_lark_string(')' + chr(10) + '```')}"

    def grammar(self, forced: Sequence[Function], free_text: bool, single: bool) -> str:
        # One call per message in this family.
        rules = [f"call_{i}: {self._call_rule(f)}" for i, f in enumerate(forced)]
        alternatives = " | ".join(f"call_{i}" for i in range(len(forced)))
        if not free_text:
            return "%llguidance {}\nstart: " + alternatives + "\n" + "\n".join(rules) + "\n"
        # A plain reply has no function name: its first line is empty.
        free = "FREE: /\\n(?s:.*)/"
        return f"%llguidance {{}}\nstart: FREE | {alternatives}\n{free}\n" + "\n".join(rules) + "\n"

    def instructions(self) -> str:
        listed = json.dumps([f.as_tool()["function"] for f in self.functions], ensure_ascii=False)
        return (
            "Answer the following questions as best as you can. You have access to the "
            f"following tools:\n{listed}"
        )

    def render_calls(self, calls: Sequence[Mapping[str, Any]]) -> str:
        c = calls[0]
        args = c["arguments"] if isinstance(c["arguments"], Mapping) else {}
        kwargs = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
        return f"{c['name']}\n```python\ntool_call({kwargs})\n```"


def _python_kwargs_json(source: str) -> str:
    """``a=1, b="x"`` (Python literals; JSON's true/false/null too) as a JSON object's text,
    or "" when it is not that."""
    try:
        call = ast.parse(f"f({source})", mode="eval").body
    except SyntaxError:
        return ""
    if not isinstance(call, ast.Call) or call.args:
        return ""
    out: dict[str, Any] = {}
    for kw in call.keywords:
        if kw.arg is None:
            return ""
        try:
            out[kw.arg] = ast.literal_eval(_JsonNames().visit(kw.value))
        except (ValueError, SyntaxError, TypeError):
            return ""
    return json.dumps(out, ensure_ascii=False)


class _JsonNames(ast.NodeTransformer):
    """``true``/``false``/``null`` as Python constants."""

    _NAMES: ClassVar[dict[str, Any]] = {"true": True, "false": False, "null": None}

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self._NAMES:
            return ast.copy_location(ast.Constant(self._NAMES[node.id]), node)
        return node
