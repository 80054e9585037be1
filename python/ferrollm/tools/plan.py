"""One chat request's tool calling: the family its calls are written in, what the chat template
gets (the tools, or for a template that ignores them, a system prompt offering them and the
earlier calls and results written into the history), the grammar that holds the model to the
``tool_choice``, and a `ToolStream` per returned sequence to read the calls back."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ferrollm.tokenizer import Tokenizer
from ferrollm.tools.formats import FORMATS, Function, MistralFormat, ToolFormat, detect_format
from ferrollm.tools.stream import ToolStream

#: ``--tool-call-parser`` values: a family, "auto" (detected from the chat template) or
#: "none" (tool calling off: tools are refused unless ``tool_choice`` is "none").
PARSER_CHOICES = ("auto", "none", *FORMATS)


class ToolPlanError(ValueError):
    """A request's tools cannot be served as asked; ``param`` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@functools.lru_cache(maxsize=16)
def resolve_parser(option: str, template: str | None) -> str | None:
    """The family ``--tool-call-parser option`` means for a model with ``template`` (None:
    tool calling is off). Cached: a server asks it with the same two strings per request."""
    if option == "none":
        return None
    if option == "auto":
        return detect_format(template)
    if option not in FORMATS:
        raise ValueError(
            f"`tool_call_parser` must be one of {', '.join(PARSER_CHOICES)}; got {option!r}"
        )
    return option


def _marker_token(fmt: type[ToolFormat], tokenizer: Tokenizer) -> int | None:
    """The id of the family's call marker when the tokenizer has it as one special token."""
    if fmt is not MistralFormat:
        return None
    ids = tokenizer.encode(MistralFormat.MARKER, add_special_tokens=False)
    if len(ids) == 1 and tokenizer.detokenizer.is_special(ids[0]):
        return ids[0]
    return None


@dataclass
class ToolPlan:
    """How one request's tools are offered, enforced and read back."""

    format: ToolFormat
    #: "auto", "required" or "named".
    choice: str
    #: The functions a call may name (the named one, or all).
    forced: list[Function]
    #: Whether the chat template renders ``tools`` and ``tool_calls`` itself.
    template_renders_tools: bool

    @property
    def keeps_special_tokens(self) -> bool:
        """Whether the output text must keep special tokens (the marker is one)."""
        return self.format.keeps_special_tokens and self.format.marker_token is not None

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools for the chat template's ``tools`` variable."""
        return [f.as_tool() for f in self.format.functions]

    def prompt_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` with the functions offered in a system prompt when the template does
        not render ``tools`` itself."""
        if self.template_renders_tools:
            return messages
        offer = self.format.instructions()
        if messages and messages[0]["role"] == "system":
            first = {**messages[0], "content": f"{messages[0]['content']}\n\n{offer}"}
            return [first, *messages[1:]]
        return [{"role": "system", "content": offer}, *messages]

    def grammar(self) -> str:
        """The Lark grammar that holds the output to ``tool_choice``."""
        return self.format.grammar(
            self.forced, free_text=self.choice == "auto", single=self.choice == "named"
        )

    def stream(self) -> ToolStream:
        """A reader for one returned sequence."""
        return ToolStream(self.format, self.format.names)


@functools.lru_cache(maxsize=16)
def renders_tools(template: str | None) -> bool:
    """Whether a chat template uses its ``tools`` variable (cached, like `resolve_parser`)."""
    return template is not None and re.search(r"\btools\b", template) is not None


def plan_tools(
    parser: str | None,
    tokenizer: Tokenizer,
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: Any,
    grammar_field: str | None,
) -> ToolPlan | None:
    """The plan for a validated request's ``tools`` and ``tool_choice`` (None when the request
    calls no tools). Raises ToolPlanError when tool calling is off for this model, or the
    request also asks for another grammar."""
    if not tools or tool_choice == "none":
        return None
    if parser is None:
        raise ToolPlanError(
            "tools",
            "`tools`: this server does not parse tool calls (started with "
            '`--tool-call-parser none`); send `tool_choice: "none"` or leave `tools` out',
        )
    if grammar_field is not None:
        raise ToolPlanError(
            grammar_field,
            f"`{grammar_field}` cannot be used with `tools` unless `tool_choice` is "
            '"none" (one grammar per request)',
        )
    functions = [Function.from_tool(t) for t in tools]
    cls = FORMATS[parser]
    fmt = cls(functions, _marker_token(cls, tokenizer))
    source = tokenizer.chat_template.source if tokenizer.chat_template else None
    if isinstance(tool_choice, Mapping):
        name = tool_choice["function"]["name"]
        forced = [f for f in functions if f.name == name]
        choice = "named"
    else:
        forced, choice = functions, tool_choice or "auto"
    return ToolPlan(fmt, choice, forced, renders_tools(source))


def history_messages(
    parser: str | None, template: str | None, messages: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``messages`` for a template that does not render ``tool_calls`` or tool results: each
    earlier call written into its assistant message the way the model writes calls, and each
    result marked as one. Unchanged for templates that render them (and with no parser)."""
    if parser is None or template is None or "tool_calls" in template:
        return messages
    fmt = FORMATS[parser]([])
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [c["function"] for c in m["tool_calls"]]
            text = fmt.render_calls(calls)
            content = f"{m['content']}\n{text}" if m.get("content") else text
            m = {k: v for k, v in m.items() if k != "tool_calls"} | {"content": content}
        elif m["role"] == "tool":
            m = {**m, "content": fmt.render_result(m["content"])}
        out.append(m)
    return out
