"""Chat: ``POST /v1/chat/completions`` (docs/api/openai.md#chat-completions) and the Databricks chat
task (its request and response: the Databricks API reference listed in docs/README.md).

Both render the messages with the model's chat template and stream ``chat.completion.chunk``
events; what differs between the APIs (MindIE's timing fields and ``fullTextEnabled`` on
``/v1``, ids, finish reasons, how an early end is said) is the request's `Renderer`. vLLM's
``prompt_logprobs`` scores the rendered prompt's tokens (not with streaming).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
from msgspec import UNSET, UnsetType

from ferrollm._core import ValidRequest
from ferrollm.engine import CompletionOutput, RequestOutput
from ferrollm.engine.request import EngineRequest
from ferrollm.reasoning import ReasoningPlan
from ferrollm.server.context import ServerContext
from ferrollm.server.errors import to_api_error
from ferrollm.server.generation import Timing, generate, prime
from ferrollm.server.http import SSE_DONE, JSONResponse, Request, Response, SSEResponse, sse_event
from ferrollm.server.protocol.openai import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    Delta,
    Usage,
)
from ferrollm.server.reasoning import StreamedReasoning
from ferrollm.server.render import OpenAIRenderer, Outcome, Renderer
from ferrollm.server.routes.common import (
    CLIENT_ID_HEADER,
    accept,
    check_deadline,
    client_id_header,
    engine_request,
    usage_counts,
)
from ferrollm.server.routes.logprobs import chat_logprobs, vllm_prompt_logprobs
from ferrollm.server.tool_calls import StreamedCalls, chat_prompt, response_message
from ferrollm.tools import ToolPlan


@dataclass
class _Chat:
    """One chat request, validated and tokenized, and how its API renders it."""

    render: Renderer
    #: The id the response shows (the API's; the engine's request has its own).
    response_id: str
    created: int
    request: EngineRequest
    #: vLLM's ``prompt_logprobs`` (alternatives per prompt token), None when not asked.
    num_prompt_logprobs: int | None = None
    #: The request's tool calling, None when it calls no tools.
    tools: ToolPlan | None = None
    #: How its outputs split reasoning from content, None when they do not (on this API).
    reasoning: ReasoningPlan | None = None

    def outcome(self, c: CompletionOutput) -> Outcome:
        return Outcome.of(c, self.request.params)


async def chat_completions(ctx: ServerContext, request: Request) -> Response:
    """``POST /v1/chat/completions``."""
    valid = await accept(ctx, "chat", request)
    render = OpenAIRenderer(ctx, lora=ctx.select_model(valid.model))
    return await serve_chat(ctx, request, valid, render)


async def serve_chat(
    ctx: ServerContext, request: Request, valid: ValidRequest, render: Renderer
) -> Response:
    """Render and run a validated chat request through ``render``'s API (its media parts
    loaded first, on a multimodal model)."""
    client_id = client_id_header(request)
    media = None if ctx.media is None else await ctx.media.chat(valid.messages)
    prompt = await chat_prompt(ctx, valid, len(request.body), media)
    req = engine_request(
        valid,
        ctx.generator.new_request_id(),
        prompt.token_ids,
        request.arrival,
        grammar=prompt.grammar,
        keep_special_tokens=prompt.tools is not None and prompt.tools.keeps_special_tokens,
        lora=render.lora,
        media=prompt.media,
    )
    response_id = render.new_id("chat")
    reasoning = prompt.reasoning if render.splits_reasoning else None
    chat = _Chat(
        render, response_id, request.created, req, valid.prompt_logprobs, prompt.tools, reasoning
    )
    timing = Timing(req.arrival_time)
    stream = generate(ctx, req, timing, client_id, CLIENT_ID_HEADER)
    if valid.stream:
        return SSEResponse(_events(chat, await prime(stream)))
    last: RequestOutput | None = None
    async for out in stream:
        last = out
    assert last is not None  # the engine always ends a request with a finished output
    check_deadline(last.outputs, req.params, truncate=valid.truncate)
    return JSONResponse(msgspec.json.encode(_response(chat, last, timing)))


def _response(chat: _Chat, out: RequestOutput, timing: Timing) -> ChatCompletion:
    render = chat.render
    choices = []
    for c in out.outputs:
        message, finish_reason = response_message(
            render, chat.tools, chat.reasoning, c, chat.outcome(c)
        )
        logprobs = None if c.logprobs is None else chat_logprobs(c.logprobs)
        choices.append(ChatChoice(c.index, message, logprobs, finish_reason, c.stop_reason))
    response = ChatCompletion(
        id=chat.response_id,
        created=chat.created,
        model=render.model,
        choices=choices,
        usage=Usage(*usage_counts(chat.request.num_prompt_tokens, out.outputs)),
    )
    if render.timings:
        response.prefill_time = timing.prefill_ms
        response.decode_time_arr = timing.decode_ms
    if chat.num_prompt_logprobs is not None:
        assert out.prompt_logprobs is not None  # asked, so scored (validation)
        token_bytes = render.ctx.tokenizer.detokenizer.token_bytes
        response.prompt_logprobs = vllm_prompt_logprobs(
            out.prompt_logprobs,
            chat.num_prompt_logprobs,
            lambda token_id: token_bytes(token_id).decode("utf-8", "replace"),
        )
    return response


async def _events(chat: _Chat, stream: AsyncIterator[RequestOutput]) -> AsyncIterator[bytes]:
    """The chunks of a streamed chat, then ``[DONE]``; an early end and an error after the
    stream began are said the way the request's API says them
    (docs/api/common.md#errors-after-a-stream-began)."""
    done: set[int] = set()
    calls = None if chat.tools is None else StreamedCalls(chat.render, chat.tools)
    thoughts = None if chat.reasoning is None else StreamedReasoning(chat.reasoning)
    try:
        async for out in stream:
            chunks = [
                chunk
                for c in out.outputs
                if c.index not in done
                and (chunk := _chunk(chat, c, done, calls, thoughts)) is not None
            ]
            if out.finished and chunks:
                _finish(chat, chunks[-1], out)
            for chunk in chunks:
                yield sse_event(msgspec.json.encode(chunk))
            if out.finished:
                event = chat.render.deadline_event([chat.outcome(c) for c in out.outputs])
                if event is not None:
                    yield event
    except Exception as e:
        stop = ChatChunkChoice(0, Delta(""), None, "stop")
        yield chat.render.error_event(to_api_error(e), lambda: _new_chunk(chat, stop))
    yield SSE_DONE


def _chunk(
    chat: _Chat,
    c: CompletionOutput,
    done: set[int],
    calls: StreamedCalls | None,
    thoughts: StreamedReasoning | None,
) -> ChatCompletionChunk | None:
    """The chunk for sequence ``c``'s progress this step, or None when it has no new text yet
    (text held back: half a character, a possible stop string, a possible reasoning tag or a
    possible tool-call start; its logprobs wait with it)."""
    finished = c.finish_reason is not None
    if finished:
        done.add(c.index)
    elif not c.new_text:
        return None
    logprobs = None
    if c.new_logprobs is not None:
        logprobs = chat_logprobs(c.new_logprobs)
    delta = _delta(chat, c, calls, thoughts)
    if delta is None:
        return None
    if calls is None:
        finish_reason = chat.render.finish_reason(chat.outcome(c))
    else:
        finish_reason = calls.finish_reason(c, chat.outcome(c))
    return _new_chunk(chat, ChatChunkChoice(c.index, delta, logprobs, finish_reason))


def _delta(
    chat: _Chat,
    c: CompletionOutput,
    calls: StreamedCalls | None,
    thoughts: StreamedReasoning | None,
) -> Delta | None:
    """Sequence ``c``'s delta (None: nothing to send yet): its reasoning split off first, then
    the content after it read for tool calls. Cumulative (MindIE ``fullTextEnabled``), the
    reasoning and content so far."""
    finished = c.finish_reason is not None
    full_text = chat.render.full_text
    new_text, total = c.new_text, c.text
    reasoning: str | UnsetType = UNSET
    if thoughts is not None:
        piece = thoughts.feed(c)
        new_text, total = piece.content, thoughts.total(c.index).content
        shown = thoughts.total(c.index).reasoning if full_text else piece.reasoning
        reasoning = shown if piece.reasoning else UNSET
    if calls is not None:
        delta = calls.delta(c.index, new_text, finished, full_text)
        if delta is None and reasoning is UNSET:
            return None
        delta = delta or Delta(None)
    elif new_text or finished:
        delta = Delta(total if full_text else new_text)
    elif reasoning is UNSET:
        return None  # all held back (a possible tag)
    else:
        delta = Delta(None)
    delta.reasoning_content = reasoning
    return delta


def _new_chunk(chat: _Chat, choice: ChatChunkChoice) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id=chat.response_id,
        created=chat.created,
        model=chat.render.model,
        choices=[choice],
    )


def _finish(chat: _Chat, chunk: ChatCompletionChunk, out: RequestOutput) -> None:
    """The final chunk carries usage, ``full_text`` (fullTextEnabled) and any ``err_msg``."""
    chunk.usage = Usage(*usage_counts(chat.request.num_prompt_tokens, out.outputs))
    c = out.outputs[chunk.choices[0].index]
    if chat.render.full_text:
        chunk.full_text = c.text
    message = chat.render.final_err_msg([chat.outcome(c)])
    if message is not None:
        chunk.err_msg = message
