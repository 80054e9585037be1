"""What every tool-call family shares: the offered `Function`, the `ToolFormat` interface (reading
calls out of text, the grammar that makes the model write them, how calls and results go into
the history) and the JSON-object helpers the families build on. One module per family holds
its format (`hermes`, `llama3`, `mistral`, `chatglm3`); `formats` is their registry."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ferrollm.tools.jsonscan import Malformed, Member, object_members
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
