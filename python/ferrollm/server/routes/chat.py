"""Chat: ``POST /v1/chat/completions`` (SPEC 4) and the Databricks chat task (SPEC 6.3-6.4).

Both render the messages with the model's chat template and stream ``chat.completion.chunk``
events; the ``/v1`` route adds MindIE's extensions (``prefill_time``/``decode_time_arr``, and
``fullTextEnabled`` cumulative deltas with ``full_text`` on the final chunk) and vLLM's
``prompt_logprobs`` (the rendered prompt's tokens scored; not with streaming).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec

from ferrollm._core import ValidRequest
from ferrollm.engine import CompletionOutput, RequestOutput
from ferrollm.engine.request import EngineRequest
from ferrollm.server.context import ServerContext
from ferrollm.server.errors import ApiError, ErrorStyle, error_body, to_api_error
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
from ferrollm.server.routes.common import (
    accept,
    check_deadline,
    engine_request,
    error_message,
    openai_finish_reason,
    usage_counts,
)
from ferrollm.server.routes.logprobs import chat_logprobs, vllm_prompt_logprobs
from ferrollm.server.tool_calls import StreamedCalls, chat_prompt, response_message
from ferrollm.tools import ToolPlan


@dataclass(frozen=True)
class ChatFlavor:
    """What differs between the two chat routes."""

    route: str
    #: MindIE's extensions: timing fields and ``fullTextEnabled``.
    mindie: bool


OPENAI = ChatFlavor("chat", mindie=True)
DATABRICKS = ChatFlavor("databricks_chat", mindie=False)


@dataclass
class _Chat:
    """One chat request, validated and tokenized."""

    ctx: ServerContext
    flavor: ChatFlavor
    created: int
    request: EngineRequest
    full_text: bool
    #: vLLM's ``prompt_logprobs`` (alternatives per prompt token), None when not asked.
    num_prompt_logprobs: int | None = None
    #: The request's tool calling, None when it calls no tools.
    tools: ToolPlan | None = None


async def chat_completions(ctx: ServerContext, request: Request) -> Response:
    """``POST /v1/chat/completions``."""
    return await serve_chat(ctx, request, await accept(ctx, OPENAI.route, request), OPENAI)


async def serve_chat(
    ctx: ServerContext, request: Request, valid: ValidRequest, flavor: ChatFlavor
) -> Response:
    """Render and run a validated chat request of ``flavor``."""
    prompt = await chat_prompt(ctx, valid, len(request.body))
    request_id = ctx.next_id() if flavor.mindie else f"chatcmpl-{uuid.uuid4().hex}"
    req = engine_request(
        valid,
        request_id,
        prompt.token_ids,
        request.arrival,
        grammar=prompt.grammar,
        keep_special_tokens=prompt.tools is not None and prompt.tools.keeps_special_tokens,
    )
    full_text = flavor.mindie and ctx.config.full_text
    chat = _Chat(ctx, flavor, request.created, req, full_text, valid.prompt_logprobs, prompt.tools)
    timing = Timing(req.arrival_time)
    stream = generate(ctx, req, timing)
    if valid.stream:
        return SSEResponse(_events(chat, await prime(stream)))
    last: RequestOutput | None = None
    async for out in stream:
        last = out
    assert last is not None  # the engine always ends a request with a finished output
    check_deadline(last.outputs, req.params, truncate=valid.truncate)
    return JSONResponse(msgspec.json.encode(_response(chat, last, timing)))


def _response(chat: _Chat, out: RequestOutput, timing: Timing) -> ChatCompletion:
    choices = []
    for c in out.outputs:
        message, finish_reason = response_message(chat.tools, c, not chat.flavor.mindie)
        logprobs = None if c.logprobs is None else chat_logprobs(c.logprobs)
        choices.append(ChatChoice(c.index, message, logprobs, finish_reason, c.stop_reason))
    response = ChatCompletion(
        id=chat.request.request_id,
        created=chat.created,
        model=chat.ctx.model_name,
        choices=choices,
        usage=Usage(*usage_counts(chat.request.num_prompt_tokens, out.outputs)),
    )
    if chat.flavor.mindie:
        response.prefill_time = timing.prefill_ms
        response.decode_time_arr = timing.decode_ms
    if chat.num_prompt_logprobs is not None:
        assert out.prompt_logprobs is not None  # asked, so scored (validation)
        token_bytes = chat.ctx.tokenizer.detokenizer.token_bytes
        response.prompt_logprobs = vllm_prompt_logprobs(
            out.prompt_logprobs,
            chat.num_prompt_logprobs,
            lambda token_id: token_bytes(token_id).decode("utf-8", "replace"),
        )
    return response


async def _events(chat: _Chat, stream: AsyncIterator[RequestOutput]) -> AsyncIterator[bytes]:
    """The chunks of a streamed chat, then ``[DONE]``; an error after the stream began ends it
    with a "stop" chunk carrying ``err_msg`` (SPEC 1.13)."""
    done: set[int] = set()
    calls = None if chat.tools is None else StreamedCalls(chat.tools, not chat.flavor.mindie)
    try:
        async for out in stream:
            chunks = [
                chunk
                for c in out.outputs
                if c.index not in done and (chunk := _chunk(chat, c, done, calls)) is not None
            ]
            if out.finished and chunks:
                _finish(chat, chunks[-1], out)
            for chunk in chunks:
                yield sse_event(msgspec.json.encode(chunk))
            if out.finished and not chat.flavor.mindie:
                timeout = _databricks_timeout(chat, out)
                if timeout is not None:  # Databricks: an error event, not err_msg (SPEC 1.13)
                    yield sse_event(error_body(ErrorStyle.DATABRICKS, timeout))
    except Exception as e:
        error = to_api_error(e)
        if not chat.flavor.mindie:  # Databricks: an error event, then [DONE]
            yield sse_event(error_body(ErrorStyle.DATABRICKS, error))
        else:
            chunk = _new_chunk(chat, ChatChunkChoice(0, Delta(""), None, "stop"))
            chunk.err_msg = error.message
            yield sse_event(msgspec.json.encode(chunk))
    yield SSE_DONE


def _chunk(
    chat: _Chat, c: CompletionOutput, done: set[int], calls: StreamedCalls | None
) -> ChatCompletionChunk | None:
    """The chunk for sequence ``c``'s progress this step, or None when it has no new text yet
    (text held back: half a character, a possible stop string, or a possible tool-call start;
    its logprobs wait with it)."""
    finished = c.finish_reason is not None
    if finished:
        done.add(c.index)
    elif not c.new_text:
        return None
    logprobs = None
    if c.new_logprobs is not None:
        logprobs = chat_logprobs(c.new_logprobs)
    if calls is None:
        delta: Delta | None = Delta(c.text if chat.full_text else c.new_text)
        finish_reason = openai_finish_reason(c.finish_reason, databricks=not chat.flavor.mindie)
    else:
        delta = calls.delta(c, chat.full_text)
        finish_reason = calls.finish_reason(c)
    if delta is None:
        return None
    return _new_chunk(chat, ChatChunkChoice(c.index, delta, logprobs, finish_reason))


def _new_chunk(chat: _Chat, choice: ChatChunkChoice) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id=chat.request.request_id,
        created=chat.created,
        model=chat.ctx.model_name,
        choices=[choice],
    )


def _finish(chat: _Chat, chunk: ChatCompletionChunk, out: RequestOutput) -> None:
    """The final chunk carries usage, ``full_text`` (fullTextEnabled) and any ``err_msg``."""
    chunk.usage = Usage(*usage_counts(chat.request.num_prompt_tokens, out.outputs))
    c = out.outputs[chunk.choices[0].index]
    if chat.full_text:
        chunk.full_text = c.text
    message = error_message(c.finish_reason, chat.request.params)
    if message is not None and chat.flavor.mindie:
        chunk.err_msg = message


def _databricks_timeout(chat: _Chat, out: RequestOutput) -> ApiError | None:
    """The DEADLINE_EXCEEDED error a Databricks stream past its deadline ends with."""
    for c in out.outputs:
        if c.finish_reason == "timeout":
            message = error_message(c.finish_reason, chat.request.params)
            return ApiError(504, message or "request timed out", code="timeout")
    return None
