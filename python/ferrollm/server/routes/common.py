"""What the API handlers share: the one validation, engine requests, usage and finish
reasons."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ferrollm._core import Body, CompiledGrammar, SamplingParams, ValidRequest, validate
from ferrollm.engine.request import EngineRequest
from ferrollm.multimodal.inputs import MediaInput
from ferrollm.server.context import ServerContext
from ferrollm.server.errors import ApiError
from ferrollm.server.http import Request
from ferrollm.server.render.outcome import Outcome, first_abnormal

T = TypeVar("T")

#: Routes whose body names the ``model`` (checked against the served one,
#: docs/decisions.md#the-model-name).
_MODEL_ROUTES = ("chat", "completions", "embeddings")
#: Routes an embedding server serves (the others need the generation engine).
_EMBED_ROUTES = ("embeddings", "databricks_embeddings")


#: Work on inputs larger than this (characters of a prompt, bytes of a body) runs on a worker
#: thread (`run_sized`): decoding, validating, rendering and tokenizing a 4 MB body would
#: otherwise stall every other stream and the health probes on the event loop.
OFF_LOOP_CHARS = 32 * 1024


async def run_sized(size: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, on a worker thread when ``size`` (characters of input) is large."""
    if size > OFF_LOOP_CHARS:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


async def accept(ctx: ServerContext, route: str, request: Request) -> ValidRequest:
    """The request path's one validation, on a worker thread for a large body: the body
    parsed once (400 for malformed JSON, a non-object or a repeated key), the server's task
    (400 before any field is read), the route's rules and the features this build serves
    (400 naming the field), and the ``model`` of the ``/v1`` routes (404). ``route``
    "databricks" is the task the body's shape asks for."""
    return await run_sized(len(request.body), accept_body, ctx, route, request.body)


def accept_body(ctx: ServerContext, route: str, data: bytes) -> ValidRequest:
    """`accept` on the calling thread, for the bytes of a body."""
    body = Body.parse(data)
    if route == "databricks":
        route = body.databricks_route()
    if route in _EMBED_ROUTES:
        ctx.embedder  # noqa: B018 (400 on a generation server)
    else:
        ctx.generator  # noqa: B018 (400 on an embedding server)
    valid = validate(route, body, ctx.limits)
    if route in _MODEL_ROUTES:
        ctx.select_model(valid.model)
    return valid


def engine_request(
    valid: ValidRequest,
    request_id: str,
    token_ids: Sequence[int],
    arrival: float,
    *,
    prompt: str | None = None,
    index: int | None = None,
    grammar: CompiledGrammar | None = None,
    keep_special_tokens: bool = False,
    lora: str | None = None,
    media: tuple[MediaInput, ...] = (),
) -> EngineRequest:
    """The engine's request for one tokenized prompt of ``valid`` (``index``: its place in a
    batch): cut under ``error_behavior: "truncate"``, then the prompt-token limit and the
    output cap, in one call; ``grammar`` is its compiled structured-output or tool grammar;
    ``keep_special_tokens`` keeps them in the text (a tool-call marker that is one); ``lora``
    is the adapter the request's model name selected; ``media`` the prompt's expanded media
    (`ferrollm.server.media_intake`)."""
    ids, params = valid.fit_prompt(token_ids, index)
    if keep_special_tokens:
        params = params.keeping_special_tokens()
    return EngineRequest(
        request_id, ids, params, arrival, prompt=prompt, grammar=grammar, lora=lora, media=media
    )


def usage_counts(num_prompt_tokens: int, outputs: Sequence[Any]) -> tuple[int, int, int]:
    """(prompt, completion, total) tokens; completion counts every returned sequence."""
    completion = sum(len(c.token_ids) for c in outputs)
    return num_prompt_tokens, completion, num_prompt_tokens + completion


def check_deadline(outputs: Sequence[Any], params: SamplingParams, *, truncate: bool) -> None:
    """A whole (non-streamed) response whose request ran past its deadline is a 504
    (docs/api/common.md#deadlines), unless Databricks ``error_behavior: "truncate"`` asked for the
    partial text."""
    timed_out = first_abnormal(
        Outcome.of(c, params) for c in outputs if c.finish_reason == "timeout"
    )
    if truncate or timed_out is None:
        return
    raise ApiError(504, timed_out.message or "request timed out", code="timeout")


#: The request header that names a /v1 generation with the client's own id, so that
#: ``GET /v1/playground/queue/{client_id}`` can say where it waits (the playground sends it).
CLIENT_ID_HEADER = "X-Ferrollm-Client-Id"
_CLIENT_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-")
_CLIENT_ID_MAX = 128


def client_id_header(request: Request) -> str | None:
    """The request's `CLIENT_ID_HEADER` value, or None without one; a 400 naming the header
    unless it is 1 to 128 letters, digits and ``._:-``."""
    raw = request.headers.get(CLIENT_ID_HEADER.lower().encode())
    if raw is None:
        return None
    value = raw.decode("latin-1")
    if not 0 < len(value) <= _CLIENT_ID_MAX or not set(value) <= _CLIENT_ID_CHARS:
        raise ApiError(
            400,
            f"`{CLIENT_ID_HEADER}` must be 1 to {_CLIENT_ID_MAX} letters, digits, '.', '_', "
            f"':' or '-'; got {value[:40]!r}",
            param=CLIENT_ID_HEADER,
            code="invalid_value",
        )
    return value
