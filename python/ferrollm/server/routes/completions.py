"""Completions: ``POST /v1/completions`` (docs/api/openai.md#completions) and the Databricks
completions task (its request: the Databricks API reference listed in docs/README.md).

A prompt list is a batch (docs/decisions.md#prompt-lists): one engine request per prompt, run
together, choices ordered ``index = prompt_index * n + k``. The ``/v1`` route reports MindIE's
per-step ``batch_size``/``queue_wait_time`` usage arrays and ``stop_reason``; Databricks adds
``echo``, ``suffix`` (appended, docs/decisions.md#the-suffix) and ``error_behavior: "truncate"``
(the prompt is cut from the left to fit, docs/decisions.md#what-truncate-does).

On ``/v1`` a prompt may also be token ids (one list, or a list of lists), which ``echo`` shows
decoded. ``echo`` with ``logprobs`` (both routes) returns the prompt's tokens and logprobs
before the completion's, the first prompt token's logprob null; ``max_tokens: 0`` with
``echo`` returns the prompt alone, scored (the one token the engine runs is left out); vLLM's
``prompt_logprobs`` adds each choice's ``prompt_logprobs``.

Beam search (``use_beam_search``) returns the ``n`` best hypotheses as choices, best first; its
stream is MindIE's "fake streaming", one event with the whole response (``_fake_stream``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ferrollm._core import ValidRequest
from ferrollm.engine import CompletionOutput, RequestOutput
from ferrollm.engine.request import EngineRequest
from ferrollm.server.context import ServerContext
from ferrollm.server.errors import ApiError, to_api_error
from ferrollm.server.generation import Timing, generate, merge, prime
from ferrollm.server.http import SSE_DONE, JSONResponse, Request, Response, SSEResponse, sse_event
from ferrollm.server.protocol.openai import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionUsage,
)
from ferrollm.server.render import OpenAIRenderer, Outcome, Renderer
from ferrollm.server.routes.common import (
    CLIENT_ID_HEADER,
    accept,
    check_deadline,
    client_id_header,
    engine_request,
    run_sized,
)
from ferrollm.server.routes.logprobs import (
    completion_logprobs,
    joined,
    prompt_completion_logprobs,
    vllm_prompt_logprobs,
)
from ferrollm.server.structured import compiled_grammar


@dataclass
class _Prompt:
    text: str
    request: EngineRequest
    timing: Timing


@dataclass
class _Batch:
    """One completions request: its prompts and how to render its choices."""

    ctx: ServerContext
    #: The request's API: ids, finish reasons, the completion's shape, early ends.
    render: Renderer
    #: The id the response shows (each prompt's engine request has its own).
    response_id: str
    created: int
    prompts: list[_Prompt]
    echo: bool
    suffix: str
    #: The token text in logprobs (its bytes, a partial character as U+FFFD).
    text_of: Callable[[int], str]
    #: Completions ``logprobs``: alternatives per token, None when not asked.
    num_logprobs: int | None = None
    #: vLLM's ``prompt_logprobs``: alternatives per prompt token, None when not asked.
    num_prompt_logprobs: int | None = None
    #: ``max_tokens: 0`` with ``echo``: the prompt alone, scored.
    score_only: bool = False
    #: Per choice index: the next ``text_offset`` (streamed logprobs keep counting).
    offsets: dict[int, int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return self.prompts[0].request.params.n

    def outcomes(self, finals: dict[int, RequestOutput]) -> list[Outcome]:
        """Every returned sequence's ending, prompt by prompt."""
        return [
            Outcome.of(c, self.prompts[i].request.params)
            for i in range(len(self.prompts))
            for c in finals[i].outputs
        ]


async def completions(ctx: ServerContext, request: Request) -> Response:
    """``POST /v1/completions``."""
    valid = await accept(ctx, "completions", request)
    render = OpenAIRenderer(ctx, lora=ctx.select_model(valid.model))
    return await serve_completions(ctx, request, valid, render)


async def serve_completions(
    ctx: ServerContext, request: Request, valid: ValidRequest, render: Renderer
) -> Response:
    """Tokenize and run a validated completions request (one engine request per prompt)
    through ``render``'s API."""
    batch = _Batch(
        ctx,
        render,
        render.new_id("completion"),
        request.created,
        [],
        valid.echo,
        render.suffix(valid.suffix),
        _token_text(ctx),
        valid.params.logprobs,
        valid.prompt_logprobs,
        valid.score_only,
    )
    ctx.admission.check_batch(len(valid.prompts))  # before any tokenizing
    client_id = client_id_header(request)
    if client_id is not None and len(valid.prompts) > 1:
        raise ApiError(
            400,
            f"`{CLIENT_ID_HEADER}` names one request; a batch of {len(valid.prompts)} prompts "
            "is as many requests",
            param=CLIENT_ID_HEADER,
            code="invalid_value",
        )
    grammar = await compiled_grammar(ctx, valid)
    for i, prompt in enumerate(valid.prompts):
        text, ids = await _tokenized(ctx, prompt, echo=valid.echo)
        engine_id = ctx.generator.new_request_id()
        req = engine_request(
            valid,
            engine_id,
            ids,
            request.arrival,
            prompt=text,
            index=i,
            grammar=grammar,
            lora=render.lora,
        )
        batch.prompts.append(_Prompt(text, req, Timing(req.arrival_time)))
    total = sum(p.request.num_prompt_tokens for p in batch.prompts)
    ctx.admission.check_batch(len(batch.prompts), total)
    streams = [
        generate(ctx, p.request, p.timing, client_id, CLIENT_ID_HEADER) for p in batch.prompts
    ]
    if valid.stream and valid.params.use_beam_search:
        return SSEResponse(_fake_stream(batch, await prime(merge(streams))))
    if valid.stream:
        return SSEResponse(_events(batch, await prime(merge(streams))))
    finals = await _finals(merge(streams))
    for i, out in finals.items():
        check_deadline(out.outputs, batch.prompts[i].request.params, truncate=valid.truncate)
    return JSONResponse(msgspec.json.encode(_response(batch, finals)))


async def _finals(stream: AsyncIterator[tuple[int, RequestOutput]]) -> dict[int, RequestOutput]:
    """Each prompt's last output."""
    finals: dict[int, RequestOutput] = {}
    async for i, out in stream:
        if out.finished:
            finals[i] = out
    return finals


async def _fake_stream(
    batch: _Batch, stream: AsyncIterator[tuple[int, RequestOutput]]
) -> AsyncIterator[bytes]:
    """Beam search streamed MindIE's way (docs/api/openai.md#beam-search, "fake streaming"): nothing
    is final before the search ends, so one event holds the whole ``text_completion`` (every choice,
    its logprobs and finish reason, and usage), then ``[DONE]``."""
    try:
        yield sse_event(msgspec.json.encode(_response(batch, await _finals(stream))))
    except Exception as e:
        yield _error_event(batch, to_api_error(e))
    yield SSE_DONE


def _token_text(ctx: ServerContext) -> Callable[[int], str]:
    token_bytes = ctx.tokenizer.detokenizer.token_bytes
    return lambda token_id: token_bytes(token_id).decode("utf-8", "replace")


async def _tokenized(
    ctx: ServerContext, prompt: str | list[int], *, echo: bool
) -> tuple[str, Sequence[int]]:
    """A prompt's text (what ``echo`` shows) and token ids."""
    if isinstance(prompt, str):
        return prompt, await run_sized(len(prompt), ctx.tokenizer.encode, prompt)
    # Token ids, each checked against the vocabulary by the validator.
    text = ctx.tokenizer.decode(prompt, skip_special_tokens=False) if echo else ""
    return text, prompt


def _choice(
    batch: _Batch,
    out: RequestOutput,
    prompt_index: int,
    c: CompletionOutput,
    *,
    text: str,
    whole: bool,
) -> CompletionChoice:
    """A choice of prompt ``prompt_index``'s sequence ``c`` (in ``out``): ``text`` is its new
    text (a stream) or all of it (``whole``); echo and suffix are added where the text starts
    and ends."""
    index = prompt_index * batch.n + c.index
    first = whole or index not in batch.offsets
    if batch.score_only:
        text = ""  # the token run to score the prompt is not part of the answer
    if batch.echo and first:
        text = batch.prompts[prompt_index].text + text
    if batch.suffix and c.finish_reason is not None:
        text += batch.suffix
    logprobs = _logprobs(batch, out, index, c, whole=whole, first=first)
    stop_reason = c.stop_reason
    params = batch.prompts[prompt_index].request.params
    finish_reason = batch.render.finish_reason(Outcome.of(c, params))
    return CompletionChoice(index, text, logprobs, finish_reason, stop_reason)


def _logprobs(
    batch: _Batch, out: RequestOutput, index: int, c: CompletionOutput, *, whole: bool, first: bool
) -> CompletionLogprobs | None:
    """Choice ``index``'s logprobs for this response or chunk: with ``echo``, the prompt's
    tokens first (in the first chunk); ``text_offset`` keeps counting across chunks."""
    entries = c.logprobs if whole else c.new_logprobs
    if batch.num_logprobs is None or entries is None:
        batch.offsets.setdefault(index, 0)
        return None
    if batch.score_only:
        entries = []
    echoed = None
    start = batch.offsets.get(index, 0)
    if batch.echo and first:
        # Asked together with `logprobs`, so the engine scored the prompt (validation).
        assert out.prompt_logprobs is not None
        echoed, start = prompt_completion_logprobs(
            out.prompt_token_ids, out.prompt_logprobs, batch.num_logprobs, batch.text_of
        )
    logprobs, batch.offsets[index] = completion_logprobs(entries, start)
    return logprobs if echoed is None else joined(echoed, logprobs)


def _usage(batch: _Batch, finals: Sequence[RequestOutput]) -> CompletionUsage:
    num_prompt = sum(p.request.num_prompt_tokens for p in batch.prompts)
    num_completion = 0  # `max_tokens: 0`: the token run to score the prompt is not returned
    if not batch.score_only:
        num_completion = sum(len(c.token_ids) for out in finals for c in out.outputs)
    longest = max((p.timing for p in batch.prompts), key=lambda t: len(t.batch_sizes))
    return CompletionUsage(
        num_prompt,
        num_completion,
        num_prompt + num_completion,
        longest.batch_sizes,
        longest.queue_waits_us,
    )


def _response(batch: _Batch, finals: dict[int, RequestOutput]) -> Any:
    choices = [
        _choice(batch, finals[i], i, c, text=c.text, whole=True)
        for i in range(len(batch.prompts))
        for c in finals[i].outputs
    ]
    if batch.num_prompt_logprobs is not None:
        for choice in choices:
            scores = finals[choice.index // batch.n].prompt_logprobs
            assert scores is not None  # asked, so scored (validation)
            choice.prompt_logprobs = vllm_prompt_logprobs(
                scores, batch.num_prompt_logprobs, batch.text_of
            )
    if batch.render.offsets_across_choices:
        _count_offsets_across_choices(choices)
    response = _stream_chunk(batch, choices)
    _finish(batch, response, finals)
    return response


def _count_offsets_across_choices(choices: list[CompletionChoice]) -> None:
    """MindIE's ``text_offset``: choice k's offsets go on from where choice k-1's text ended."""
    base = 0
    for choice in choices:
        if choice.logprobs is not None:
            choice.logprobs.text_offset = [base + o for o in choice.logprobs.text_offset]
        base += len(choice.text)


async def _events(
    batch: _Batch, stream: AsyncIterator[tuple[int, RequestOutput]]
) -> AsyncIterator[bytes]:
    """Incremental ``text_completion`` chunks, usage on the last one, then ``[DONE]``."""
    finals: dict[int, RequestOutput] = {}
    done: set[tuple[int, int]] = set()
    try:
        async for i, out in stream:
            chunks = []
            for c in out.outputs:
                if (i, c.index) in done:
                    continue
                if c.finish_reason is not None:
                    done.add((i, c.index))
                elif not c.new_text and not (
                    batch.echo and i * batch.n + c.index not in batch.offsets
                ):
                    continue
                chunks.append(
                    _stream_chunk(batch, [_choice(batch, out, i, c, text=c.new_text, whole=False)])
                )
            if out.finished:
                finals[i] = out
                if len(finals) == len(batch.prompts) and chunks:
                    _finish(batch, chunks[-1], finals)
            for chunk in chunks:
                yield sse_event(msgspec.json.encode(chunk))
            if out.finished and len(finals) == len(batch.prompts):
                event = batch.render.deadline_event(batch.outcomes(finals))
                if event is not None:
                    yield event
    except Exception as e:
        yield _error_event(batch, to_api_error(e))
    yield SSE_DONE


def _stream_chunk(batch: _Batch, choices: list[CompletionChoice]) -> Any:
    return batch.render.completion(batch.response_id, batch.created, choices)


def _finish(batch: _Batch, chunk: Any, finals: dict[int, RequestOutput]) -> None:
    """The last chunk (or the whole response) carries usage and any ``err_msg``."""
    usage = _usage(batch, [finals[i] for i in range(len(batch.prompts))])
    chunk.usage = batch.render.completion_usage(usage)
    message = batch.render.final_err_msg(batch.outcomes(finals))
    if message is not None:
        chunk.err_msg = message


def _error_event(batch: _Batch, error: ApiError) -> bytes:
    """The event that ends a stream an error cut short
    (docs/api/common.md#errors-after-a-stream-began)."""
    stop = CompletionChoice(0, "", None, "stop", None)
    return batch.render.error_event(error, lambda: _stream_chunk(batch, [stop]))
