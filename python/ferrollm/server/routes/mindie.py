"""MindIE ``POST /v2/models/{model}/generate_stream`` (docs/api/mindie.md) and ``generate``
(docs/api/mindie.md#generate-response).

``finish_reason`` lives in ``details`` (docs/decisions.md#where-generate-puts-its-finish-reason):
``eos_token`` for a normal end, ``length`` at a length limit, and ``stop_sequence`` with ``err_msg``
when a timeout or an error ended the request (docs/decisions.md#abnormal-ends-on-generate,
docs/decisions.md#request-timeouts). With ``details: false`` only the final frame has ``details``
(docs/decisions.md#details-when-not-asked-for). The stream ends after the final frame: no ``[DONE]``
(docs/decisions.md#the-end-of-stream-sentinel). On a multimodal model ``text_input`` may carry
one image part (docs/api/mindie.md#media-parts): no chat template, the parts joined with the image
as the processor's placeholder.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec

from ferrollm._core import SamplingParams
from ferrollm.engine import RequestOutput
from ferrollm.multimodal.inputs import MediaInput
from ferrollm.server.context import ServerContext
from ferrollm.server.errors import ApiError, to_api_error
from ferrollm.server.generation import Timing, generate, prime
from ferrollm.server.http import JSONResponse, Request, Response, SSEResponse, sse_event
from ferrollm.server.protocol.mindie import Details, GenerateResponse, GenerateStreamFrame
from ferrollm.server.render import Outcome
from ferrollm.server.routes.common import (
    accept,
    engine_request,
    run_sized,
)


@dataclass
class _Generate:
    ctx: ServerContext
    response_id: str
    params: SamplingParams
    timing: Timing
    details: bool
    #: The model responses name (the adapter's, else the served model's).
    model: str


async def generate_stream(ctx: ServerContext, request: Request) -> Response:
    """``POST /v2/models/{model}/generate_stream``."""
    return await _serve(ctx, request, stream=True)


async def generate_once(ctx: ServerContext, request: Request) -> Response:
    """``POST /v2/models/{model}/generate``."""
    return await _serve(ctx, request, stream=False)


async def versions_unsupported(ctx: ServerContext, request: Request) -> Response:
    """``/v2/models/{model}/versions/{version}/...``: not supported
    (docs/decisions.md#model-version-paths)."""
    raise ApiError(404, "model versions are not supported", code="not_found")


async def _serve(ctx: ServerContext, request: Request, *, stream: bool) -> Response:
    lora = ctx.select_model(request.path_params["model"])
    valid = await accept(ctx, "generate", request)
    media = None if ctx.media is None else await ctx.media.generate(request.body)
    mm: tuple[MediaInput, ...] = ()
    if media is None:
        text = valid.prompts[0]
        assert isinstance(text, str)  # only /v1/completions takes token-id prompts
        ids = await run_sized(len(text), ctx.tokenizer.encode, text)
    else:
        # No chat template: the parts joined, the image as the processor's placeholder.
        assert ctx.media is not None
        text = media.prompt
        processed = await ctx.media.process(media, text)
        ids, mm = processed.prompt_token_ids, processed.media
    client_id = valid.client_id
    response_id = client_id or ctx.next_id()
    engine_id = ctx.generator.new_request_id()
    req = engine_request(valid, engine_id, ids, request.arrival, prompt=text, lora=lora, media=mm)
    timing = Timing(req.arrival_time)
    gen = _Generate(ctx, response_id, req.params, timing, valid.details, lora or ctx.model_name)
    outputs = generate(ctx, req, gen.timing, client_id)
    if stream:
        return SSEResponse(_frames(gen, await prime(outputs)))
    last: RequestOutput | None = None
    async for out in outputs:
        last = out
    assert last is not None
    return JSONResponse(msgspec.json.encode(_response(gen, last)))


def _finish_reason(reason: str) -> str:
    return {"stop": "eos_token", "length": "length"}.get(reason, "stop_sequence")


def _details(gen: _Generate, generated: int, reason: str | None) -> Details:
    timing = gen.timing
    details = Details(
        generated_tokens=generated,
        batch_size=timing.batch_sizes[-1] if timing.batch_sizes else 0,
        queue_wait_time=timing.queue_waits_us[-1] if timing.queue_waits_us else 0,
    )
    if reason is not None:
        details.finish_reason = _finish_reason(reason)
    return details


async def _frames(gen: _Generate, outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[bytes]:
    """One frame per step that produced a token (its text may be empty while a character is
    incomplete), the last one carrying ``details.finish_reason``."""
    num_frames = 0
    full_text = gen.ctx.config.full_text
    try:
        async for out in outputs:
            c = out.outputs[0]
            finished = c.finish_reason is not None
            if not c.new_token_ids and not finished:
                continue
            message = Outcome.of(c, gen.params).message
            text = "" if message is not None else (c.text if full_text else c.new_text)
            frame = GenerateStreamFrame(
                id=gen.response_id,
                model_name=gen.model,
                text_output=text,
                prefill_time=gen.timing.prefill_ms if num_frames == 0 else None,
                decode_time=gen.timing.decode_ms[-1]
                if num_frames and gen.timing.decode_ms
                else None,
            )
            if gen.details or finished:
                frame.details = _details(gen, len(c.token_ids), c.finish_reason)
            if message is not None:
                frame.err_msg = message
            num_frames += 1
            yield sse_event(msgspec.json.encode(frame))
    except Exception as e:
        frame = GenerateStreamFrame(
            id=gen.response_id,
            model_name=gen.model,
            text_output="",
            details=_details(gen, 0, "error"),
            prefill_time=None,
            decode_time=None,
            err_msg=to_api_error(e).message,
        )
        yield sse_event(msgspec.json.encode(frame))


def _response(gen: _Generate, out: RequestOutput) -> GenerateResponse:
    c = out.outputs[0]
    outcome = Outcome.of(c, gen.params)
    if outcome.timed_out:
        raise ApiError(504, outcome.message or "request timed out", code="timeout")
    details = _details(gen, len(c.token_ids), c.finish_reason or "stop")
    # For the whole request: the wait before its first scheduling
    # (docs/api/mindie.md#generate-response).
    details.queue_wait_time = gen.timing.queue_waits_us[0] if gen.timing.queue_waits_us else 0
    return GenerateResponse(
        id=gen.response_id,
        model_name=gen.model,
        text_output=c.text,
        details=details,
        prefill_time=gen.timing.prefill_ms,
        decode_time_arr=gen.timing.decode_ms,
    )
