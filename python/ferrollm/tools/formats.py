"""How each model family writes tool calls, one `ToolFormat` per family: reading them out of
the text (`scan`, see `stream`), the grammar that makes the model write them (a Lark grammar
for llguidance: `required` and named choices allow only calls, `auto` leaves the text free
until the family's call marker and constrains what follows), and how calls and results are
written into the history for a chat template that does not render tools itself.

Families: Hermes / Qwen2.5 (``<tool_call>{json}</tool_call>``), Llama 3.x JSON (the message
is ``{"name": ..., "parameters": {...}}``), Mistral (``[TOOL_CALLS][{...}, ...]``) and
ChatGLM3 (the function name on the first line, then ``tool_call(key=value, ...)`` in a
Python code block)."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ferrollm.tools.jsonscan import Malformed, Member, object_members, skip_ws
from ferrollm.tools.stream import CallSnapshot, Snapshot

#: JSON inside calls is compact-spaced, like structured output's (see rust/grammar).
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Function:
    """One offered function: its name, description and JSON-schema parameters."""

    name: str
    description: str | None
    parameters: Mapping[str, Any] | None

    @classmethod
    def from_tool(cls, tool: Mapping[str, Any]) -> Function:
        """The function of a validated ``{"type": "function", "function": {...}}``."""
        f = tool["function"]
        return cls(f["name"], f.get("description"), f.get("parameters"))

    def schema(self) -> dict[str, Any]:
        """The parameters' schema (any object when the tool declares none)."""
        return dict(self.parameters) if self.parameters else {"type": "object"}

    def call_schema(self) -> dict[str, Any]:
        """The schema a call's arguments are held to: the parameters, closed to properties
        they do not declare unless they say otherwise (as OpenAI's strict mode and xgrammar do;
        a model left free to add keys can ramble on in them)."""
        schema = self.schema()
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        return schema

    def as_tool(self) -> dict[str, Any]:
        """The OpenAI tool object (what a prompt shows the model)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.schema()
        return {"type": "function", "function": function}


def _lark_string(text: str) -> str:
    return json.dumps(text)


def _lark_json(schema: Mapping[str, Any]) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": _JSON_STYLE})


def _object_call_schema(functions: Sequence[Function], args_key: str) -> dict[str, Any]:
    """``{"name": <one of the functions>, args_key: <its parameters>}``."""
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": f.name}, args_key: f.call_schema()},
            "required": ["name", args_key],
            "additionalProperties": False,
        }
        for f in functions
    ]
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def _hold_marker_prefix(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def _call_from_object(
    text: str, members: Mapping[str, Member], done: bool, args_keys: Sequence[str]
) -> CallSnapshot:
    call = CallSnapshot(done=done)
    name = members.get("name")
    if name is not None and name.end is not None:
        value = json.loads(text[name.start : name.end])
        call.name = value if isinstance(value, str) else ""
    for key in args_keys:
        if key in members:
            call.arguments = _arguments(text, members[key])
            break
    else:
        if done:
            call.arguments = "{}"  # a call that names no arguments takes none
    return call


def _arguments(text: str, m: Member) -> str:
    """A call's arguments as far as known: an object's text grows as written; arguments sent
    as a JSON string are its decoded content, once whole."""
    raw = text[m.start :] if m.end is None else text[m.start : m.end]
    if raw.startswith("{"):
        return raw
    if raw.startswith('"') and m.end is not None:
        value = json.loads(raw)
        return value if isinstance(value, str) else ""
    return ""


def _scan_object(
    text: str, i: int, final: bool, args_keys: Sequence[str]
) -> tuple[CallSnapshot, int | None]:
    """The call object opening at ``text[i]`` and one past its end (None while open; a
    malformed call is an unnamed snapshot that never parses)."""
    try:
        members, end = object_members(text, i, final=final)
    except (Malformed, ValueError):
        return CallSnapshot(), None
    return _call_from_object(text, members, end is not None, args_keys), end


class ToolFormat:
    """One family's tool-call writing. Instances are per request (they know its functions)."""

    #: The ``--tool-call-parser`` name.
    name: ClassVar[str]
    #: Whether the call marker is a special token that must stay in the output text.
    keeps_special_tokens: ClassVar[bool] = False

    def __init__(self, functions: Sequence[Function], marker_token: int | None = None) -> None:
        self.functions = list(functions)
        self.names = [f.name for f in functions]
        #: The id of the marker when the tokenizer has it as one special token.
        self.marker_token = marker_token

    def scan(self, text: str, final: bool) -> Snapshot:
        """The text so far, read (see `stream.Snapshot`)."""
        raise NotImplementedError

    def grammar(self, forced: Sequence[Function], free_text: bool, single: bool) -> str:
        """A Lark grammar for calls to ``forced`` functions (one call when ``single``, else one
        or more); with ``free_text``, the output may instead be (or begin with) free text, and
        only what follows the call marker is constrained."""
        raise NotImplementedError

    def instructions(self) -> str:
        """A system prompt offering the functions, for chat templates that ignore ``tools``."""
        raise NotImplementedError

    def render_calls(self, calls: Sequence[Mapping[str, Any]]) -> str:
        """Earlier calls (``{"name", "arguments"}`` with arguments as an object) as the model
        writes them, for templates that ignore ``tool_calls``."""
        raise NotImplementedError

    def render_result(self, content: str) -> str:
        """A tool result's content, for templates that do not mark tool results."""
        return content


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


FORMATS: dict[str, type[ToolFormat]] = {
    f.name: f for f in (HermesFormat, Llama3JsonFormat, MistralFormat, ChatGLM3Format)
}

#: Template text that tells each family apart, checked in order.
_SIGNS: list[tuple[str, Callable[[str], bool]]] = [
    ("hermes", lambda t: "<tool_call>" in t),
    ("mistral", lambda t: "[TOOL_CALLS]" in t),
    ("llama3_json", lambda t: "<|python_tag|>" in t or ("ipython" in t and "parameters" in t)),
    ("chatglm3", lambda t: "<|observation|>" in t),
]


def detect_format(template: str | None) -> str:
    """The family a chat template writes tool calls in; Hermes when it shows none (the format
    the prompt then teaches, see `ToolFormat.instructions`)."""
    for name, sign in _SIGNS:
        if template is not None and sign(template):
            return name
    return "hermes"
