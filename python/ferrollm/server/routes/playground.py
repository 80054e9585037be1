"""The playground's routes: its static files (``/`` and ``/playground/*``, public) and
``GET /v1/playground/info``, the server limits its form needs that ``/v1/models`` does not
carry (docs/serving.md#the-playground)."""

from __future__ import annotations

import msgspec

from ferrollm.server.context import ServerContext
from ferrollm.server.errors import ApiError
from ferrollm.server.http import JSONResponse, Request, Response
from ferrollm.server.playground import SECURITY_HEADERS, asset


class ServerQueue(msgspec.Struct, kw_only=True):
    """The server-wide queue, as both playground routes report it."""

    #: Requests admitted but waiting for their first step, server-wide, now.
    num_waiting: int
    #: Requests in flight, server-wide, now.
    num_in_flight: int


def _server_queue(ctx: ServerContext) -> dict[str, int]:
    """`ServerQueue`'s fields now; a 404 while the playground is off (--no-playground)."""
    if not ctx.config.playground:
        raise ApiError(404, "the playground is off (--no-playground)", code="not_found")
    return {"num_waiting": ctx.admission.num_waiting, "num_in_flight": ctx.guard.num_in_flight}


class PlaygroundInfo(ServerQueue, kw_only=True):
    """``GET /v1/playground/info``: the limits of the playground's form, and the queue."""

    #: The served model's name (``model`` in requests).
    model: str
    #: Prompt plus output tokens per sequence.
    max_model_len: int
    #: Prompt tokens at most.
    max_input_tokens: int
    #: Generated tokens at most, and the default ``max_tokens``.
    max_iter_times: int
    #: Largest ``top_logprobs`` (chat) and ``logprobs`` (completions).
    max_logprobs: int
    #: How tool calls are parsed (``--tool-call-parser``); "none": tools are refused.
    tool_call_parser: str


async def info(ctx: ServerContext, request: Request) -> Response:
    """``GET /v1/playground/info`` (needs the API key like every ``/v1`` route)."""
    queue = _server_queue(ctx)
    limits = ctx.limits
    body = PlaygroundInfo(
        model=ctx.model_name,
        max_model_len=limits.max_model_len,
        max_input_tokens=limits.max_input_tokens,
        max_iter_times=limits.max_iter_times,
        max_logprobs=limits.max_logprobs,
        tool_call_parser=ctx.config.tool_call_parser,
        **queue,
    )
    return JSONResponse(msgspec.json.encode(body))


class QueuePlace(ServerQueue, kw_only=True):
    """``GET /v1/playground/queue/{client_id}``: where the request sent with that
    ``X-Ferrollm-Client-Id`` waits."""

    client_id: str
    #: Its place in the engine's waiting queue (1: the next to start), as of the latest
    #: step; null when it is not waiting there (running, finished, unknown, or still behind
    #: the server's admission bound: see ``num_waiting``).
    queue_position: int | None


async def queue(ctx: ServerContext, request: Request) -> Response:
    """``GET /v1/playground/queue/{client_id}`` (needs the API key like every ``/v1``
    route). The engine publishes its queue for a few seconds after each ask, so a client
    polls while it waits for its first token; the first answer may say null."""
    queue = _server_queue(ctx)
    client_id = request.path_params["client_id"]
    position = None if ctx.task != "generate" else ctx.generator.queue_position(client_id)
    body = QueuePlace(client_id=client_id, queue_position=position, **queue)
    return JSONResponse(msgspec.json.encode(body))


def page(ctx: ServerContext, path: str) -> JSONResponse | None:
    """The playground file at ``path`` (a GET), or None when ``path`` is none of its files
    or the playground is off (the app then routes it as any other path)."""
    if not ctx.config.playground:
        return None
    found = asset(path)
    if found is None:
        return None
    body, content_type = found
    return JSONResponse(body, headers=SECURITY_HEADERS, content_type=content_type.encode())
