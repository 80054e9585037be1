"""Tool calling on the chat routes (docs/api/openai.md#tools): the prompt (tools through the chat
template, or offered in a system prompt when the template ignores them; earlier calls and
results written into the history), the grammar that holds the output to ``tool_choice``
(compiled off the event loop, like structured output's), and the calls read back out of each
returned sequence, whole or streamed as ``delta.tool_calls``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from msgspec import UNSET, UnsetType

from ferrollm._core import CompiledGrammar, ValidRequest
from ferrollm.engine import CompletionOutput
from ferrollm.multimodal.inputs import MediaInput
from ferrollm.multimodal.templates import reads_parts
from ferrollm.reasoning import ReasoningPlan
from ferrollm.server.context import ServerContext
from ferrollm.server.errors import bad_request
from ferrollm.server.media_intake import ChatMedia
from ferrollm.server.protocol.openai import (
    Delta,
    DeltaFunction,
    DeltaToolCall,
    FunctionCall,
    ResponseMessage,
    ToolCall,
)
from ferrollm.server.reasoning import reasoning_plan
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
    """A chat request's prompt tokens, its grammar, its tool plan (None: no tool calls) and
    how its outputs split reasoning from content (None: they do not)."""

    token_ids: list[int]
    grammar: CompiledGrammar | None
    tools: ToolPlan | None
    reasoning: ReasoningPlan | None = None
    #: The prompt's media expanded by the model's processor (empty for a text prompt).
    media: tuple[MediaInput, ...] = ()


def tool_parser(ctx: ServerContext) -> str | None:
    """The family this server reads tool calls in (None: tool calling is off)."""
    template = ctx.tokenizer.chat_template
    return resolve_parser(ctx.config.tool_call_parser, template.source if template else None)


async def chat_prompt(
    ctx: ServerContext, valid: ValidRequest, size: int, media: ChatMedia | None = None
) -> ChatPrompt:
    """Render and tokenize ``valid``'s messages (with its tools and its
    ``chat_template_kwargs``), and compile its grammar, which holds the answer after any
    reasoning (docs/api/openai.md#reasoning); a body of ``size`` bytes over the off-loop bound
    is rendered on a worker thread (a huge tool schema goes through the tool plan and the
    template). With ``media`` (loaded parts), the model's processor tokenizes the prompt,
    always on a worker thread."""
    if media is None:
        ids, plan, prompt, mm = await run_sized(size, _rendered, ctx, valid, None)
    else:
        ids, plan, prompt, mm = await asyncio.to_thread(_rendered, ctx, valid, media)
    reasoning = reasoning_plan(ctx, prompt)
    if plan is None:
        grammar = await compiled_grammar(ctx, valid, reasoning)
        return ChatPrompt(ids, grammar, None, reasoning, mm)
    compiler = ctx.generator.grammar_compiler

    def tools_grammar() -> CompiledGrammar:
        text = plan.grammar()
        if reasoning is not None:
            text = reasoning.answer_grammar("lark", text)
        return compiler.compile("lark", text, "tools")

    # The grammar's text holds every tool's schema: it is written on the worker thread too.
    return ChatPrompt(ids, await asyncio.to_thread(tools_grammar), plan, reasoning, mm)


#: Template variables the chat route sets itself: ``chat_template_kwargs`` may not name them.
_RESERVED_TEMPLATE_KWARGS = ("messages", "tools", "add_generation_prompt", "documents")


def _rendered(
    ctx: ServerContext, valid: ValidRequest, media: ChatMedia | None
) -> tuple[list[int], ToolPlan | None, str, tuple[MediaInput, ...]]:
    """The prompt's token ids, the tool plan (None: no tool calls), the prompt's text and
    its expanded media. With ``media``, each media part is rendered as the template reads
    parts, else as the processor's placeholder in the content's text
    (`ChatMedia.template_messages`), and the processor tokenizes the text."""
    tokenizer = ctx.tokenizer
    parser = tool_parser(ctx)
    template = tokenizer.chat_template.source if tokenizer.chat_template else None
    grammar_field = valid.grammar[2] if valid.grammar is not None else None
    try:
        plan = plan_tools(parser, tokenizer, valid.tools, valid.tool_choice, grammar_field)
    except ToolPlanError as e:
        code = "unsupported" if e.param == "tools" else "conflict"
        raise bad_request(str(e), param=e.param, code=code) from None
    kwargs = valid.chat_template_kwargs or {}
    for key in _RESERVED_TEMPLATE_KWARGS:
        if key in kwargs:
            raise bad_request(
                f"`chat_template_kwargs.{key}` is set by the server; leave it out",
                param=f"chat_template_kwargs.{key}",
            )
    tools = None if plan is None else plan.template_tools()

    def render(messages: list[dict[str, Any]], parts: bool = False) -> str:
        messages = history_messages(parser, template, messages)
        if plan is not None:
            messages = plan.prompt_messages(messages)
        if parts:
            assert media is not None
            messages = media.as_parts(messages)
        return tokenizer.apply_chat_template(messages, tools, **kwargs)

    if media is None:
        text = render(valid.template_messages)
        # No special tokens are added: the template writes its own BOS (as transformers does).
        return tokenizer.encode(text, add_special_tokens=False), plan, text, ()
    messages = media.template_messages(valid.template_messages)
    # A template that reads typed parts gets them, unless it writes a marker of its own
    # rather than the processor's placeholder: then each part is the placeholder in the text.
    text = render(messages, parts=True) if reads_parts(template) else ""
    if not media.placed(text):
        text = render(messages)
    processed = media.process(text, add_special_tokens=False)  # the template wrote the BOS
    return processed.prompt_token_ids, plan, text, processed.media


def response_message(
    render: Renderer,
    plan: ToolPlan | None,
    reasoning: ReasoningPlan | None,
    c: CompletionOutput,
    outcome: Outcome,
) -> tuple[ResponseMessage, str | None]:
    """Sequence ``c``'s message and finish reason: its reasoning split out first (when
    ``reasoning`` is given), then its calls read from the content after it when it made any
    (with the content ``render``'s API gives a message of only calls;
    docs/decisions.md#content-beside-tool-calls), else its text."""
    reason = render.finish_reason(outcome)
    text: str | None = c.text
    thought: str | UnsetType | None = UNSET
    if reasoning is not None:
        thought, text = reasoning.split(c.text)
    message = ResponseMessage(text, tool_calls=render.no_tool_calls, reasoning_content=thought)
    if plan is None or text is None:
        return message, reason
    stream = plan.stream()
    stream.feed(text, final=True)
    parsed = stream.result()
    if parsed is None or not parsed[1]:
        return message, reason
    content, calls = parsed
    message.content = content if content.strip() else render.calls_only_content
    message.tool_calls = [ToolCall(t.id, FunctionCall(t.name, t.arguments)) for t in calls]
    return message, _calls_reason(reason)


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

    def delta(self, index: int, new_text: str, finished: bool, cumulative: bool) -> Delta | None:
        """The delta for sequence ``index``'s ``new_text`` (the text after any reasoning;
        None when nothing can be sent yet); ``cumulative`` content (MindIE
        ``fullTextEnabled``) repeats all content so far."""
        stream = self._streams.setdefault(index, self.plan.stream())
        piece: ToolDelta = stream.feed(new_text, final=finished)
        content = self._content.get(index, "") + piece.content
        self._content[index] = content
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
