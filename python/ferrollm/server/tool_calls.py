"""Tool calling on the chat routes (docs/api/openai.md#tools): the prompt (tools through the chat
template, or offered in a system prompt when the template ignores them; earlier calls and
results written into the history), the grammar that holds the output to ``tool_choice``
(compiled off the event loop, like structured output's), and the calls read back out of each
returned sequence, whole or streamed as ``delta.tool_calls``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from msgspec import UNSET

from ferrollm._core import CompiledGrammar, ValidRequest
from ferrollm.engine import CompletionOutput
from ferrollm.server.context import ServerContext
from ferrollm.server.errors import bad_request
from ferrollm.server.protocol.openai import (
    Delta,
    DeltaFunction,
    DeltaToolCall,
    FunctionCall,
    ResponseMessage,
    ToolCall,
)
from ferrollm.server.render import Outcome, Renderer
from ferrollm.server.routes.common import run_sized
from ferrollm.server.structured import compiled_grammar
from ferrollm.tools import (
    ToolDelta,
    ToolPlan,
    ToolPlanError,
    ToolStream,
    history_messages,
    plan_tools,
    resolve_parser,
)


@dataclass
class ChatPrompt:
    """A chat request's prompt tokens, its grammar, and its tool plan (None: no tool calls)."""

    token_ids: list[int]
    grammar: CompiledGrammar | None
    tools: ToolPlan | None


def tool_parser(ctx: ServerContext) -> str | None:
    """The family this server reads tool calls in (None: tool calling is off)."""
    template = ctx.tokenizer.chat_template
    return resolve_parser(ctx.config.tool_call_parser, template.source if template else None)


async def chat_prompt(ctx: ServerContext, valid: ValidRequest, size: int) -> ChatPrompt:
    """Render and tokenize ``valid``'s messages (with its tools), and compile its grammar; a
    body of ``size`` bytes over the off-loop bound is rendered on a worker thread (a huge tool
    schema goes through the tool plan and the template)."""
    ids, plan = await run_sized(size, _rendered, ctx, valid)
    if plan is None:
        return ChatPrompt(ids, await compiled_grammar(ctx, valid), None)
    compiler = ctx.generator.grammar_compiler
    # The grammar's text holds every tool's schema: it is written on the worker thread too.
    grammar = await asyncio.to_thread(lambda: compiler.compile("lark", plan.grammar(), "tools"))
    return ChatPrompt(ids, grammar, plan)


def _rendered(ctx: ServerContext, valid: ValidRequest) -> tuple[list[int], ToolPlan | None]:
    """The prompt's token ids and the tool plan (None: no tool calls)."""
    tokenizer = ctx.tokenizer
    parser = tool_parser(ctx)
    template = tokenizer.chat_template.source if tokenizer.chat_template else None
    grammar_field = valid.grammar[2] if valid.grammar is not None else None
    try:
        plan = plan_tools(parser, tokenizer, valid.tools, valid.tool_choice, grammar_field)
    except ToolPlanError as e:
        code = "unsupported" if e.param == "tools" else "conflict"
        raise bad_request(str(e), param=e.param, code=code) from None
    messages = history_messages(parser, template, valid.template_messages)
    tools = None
    if plan is not None:
        messages = plan.prompt_messages(messages)
        tools = plan.template_tools()
    return tokenizer.encode_chat(messages, tools), plan


def response_message(
    render: Renderer, plan: ToolPlan | None, c: CompletionOutput, outcome: Outcome
) -> tuple[ResponseMessage, str | None]:
    """Sequence ``c``'s message and finish reason: its calls when it made any (with the
    content ``render``'s API gives a message of only calls;
    docs/decisions.md#content-beside-tool-calls), else its text."""
    reason = render.finish_reason(outcome)
    if plan is None:
        return ResponseMessage(c.text, tool_calls=render.no_tool_calls), reason
    stream = plan.stream()
    stream.feed(c.text, final=True)
    parsed = stream.result()
    if parsed is None or not parsed[1]:
        return ResponseMessage(c.text, tool_calls=render.no_tool_calls), reason
    content, calls = parsed
    text = content if content.strip() else render.calls_only_content
    tool_calls = [ToolCall(t.id, FunctionCall(t.name, t.arguments)) for t in calls]
    return ResponseMessage(text, tool_calls=tool_calls), _calls_reason(reason)


def _calls_reason(reason: str | None) -> str | None:
    return "tool_calls" if reason == "stop" else reason


@dataclass
class StreamedCalls:
    """The tool-call readers of one streamed chat, one per returned sequence."""

    #: The request's API (its finish reasons differ on deadlines).
    render: Renderer
    plan: ToolPlan
    _streams: dict[int, ToolStream] = field(default_factory=dict)
    _content: dict[int, str] = field(default_factory=dict)

    def delta(self, c: CompletionOutput, cumulative: bool) -> Delta | None:
        """The delta for ``c``'s new text (None when nothing can be sent yet); ``cumulative``
        content (MindIE ``fullTextEnabled``) repeats all content so far."""
        stream = self._streams.setdefault(c.index, self.plan.stream())
        finished = c.finish_reason is not None
        piece: ToolDelta = stream.feed(c.new_text, final=finished)
        content = self._content.get(c.index, "") + piece.content
        self._content[c.index] = content
        if not piece.content and not piece.calls and not finished:
            return None
        calls = [
            DeltaToolCall(
                d.index,
                DeltaFunction(UNSET if d.name is None else d.name, d.arguments),
                id=UNSET if d.id is None else d.id,
                type=UNSET if d.id is None else "function",
            )
            for d in piece.calls
        ]
        text: str | None = content if cumulative else piece.content
        if calls and not piece.content:
            text = None
        return Delta(text, tool_calls=calls or UNSET)

    def finish_reason(self, c: CompletionOutput, outcome: Outcome) -> str | None:
        """``tool_calls`` when sequence ``c`` ended (on its own) having made calls."""
        reason = self.render.finish_reason(outcome)
        stream = self._streams.get(c.index)
        if stream is not None and stream.has_calls:
            return _calls_reason(reason)
        return reason
