"""The ASGI app: a routing table, the lifespan that starts and stops the engine, and the
per-request plumbing (bounded body, error bodies, disconnect = abort).

Each request runs as a task beside a watcher of ``receive``: when the client disconnects the
watcher cancels the task, which closes the request's output stream, which aborts the request
at the engine's next step and frees its KV blocks (docs/api/common.md#disconnects).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ferrollm.engine import AsyncEngine
from ferrollm.server.context import ServerContext
from ferrollm.server.errors import (
    ApiError,
    DatabricksErrorBody,
    ErrorStyle,
    error_body,
    to_api_error,
)
from ferrollm.server.guard import exit_on_engine_death
from ferrollm.server.http import (
    JSONResponse,
    Message,
    Receive,
    Request,
    Scope,
    Send,
    header_map,
    read_body,
)
from ferrollm.server.openapi import openapi_document
from ferrollm.server.protocol import databricks as dbx
from ferrollm.server.protocol import embeddings as emb
from ferrollm.server.protocol import mindie as mi
from ferrollm.server.protocol import openai as oa
from ferrollm.server.routes import (
    chat,
    completions,
    databricks,
    embeddings,
    lora_admin,
    mindie,
    ops,
    playground,
)
from ferrollm.server.routing import Route
from ferrollm.server.signals import on_termination

logger = logging.getLogger("ferrollm.server")

#: Seconds the requests ended at the drain timeout get to write their error before the engine
#: stops (well inside the worker's kill margin, ``ferrollm.server.transport.KILL_MARGIN_S``).
ERROR_FLUSH_S = 2.0

ROUTES = (
    Route("POST", "/v1/chat/completions", chat.chat_completions, "Chat completion (MindIE/vLLM)",
          oa.ChatCompletionRequest, oa.ChatCompletion, oa.ChatCompletionChunk),
    Route("POST", "/v1/completions", completions.completions, "Text completion (MindIE/vLLM)",
          oa.CompletionRequest, oa.Completion, oa.Completion),
    Route("POST", "/v1/embeddings", embeddings.embeddings, "Embeddings (OpenAI; --task embed)",
          emb.EmbeddingRequest, emb.EmbeddingResponse),
    Route("GET", "/v1/models", ops.models, "The served model and its LoRA adapters", None,
          oa.ModelList),
    Route("POST", "/v1/load_lora_adapter", lora_admin.load_lora_adapter,
          "Load a LoRA adapter (--allow-runtime-lora-updating)", lora_admin.LoadLoRAAdapter),
    Route("POST", "/v1/unload_lora_adapter", lora_admin.unload_lora_adapter,
          "Unload a LoRA adapter (--allow-runtime-lora-updating)", lora_admin.UnloadLoRAAdapter),
    Route("POST", "/v2/models/{model}/generate", mindie.generate_once, "MindIE generate",
          mi.GenerateRequest, mi.GenerateResponse),
    Route("POST", "/v2/models/{model}/generate_stream", mindie.generate_stream,
          "MindIE generate_stream (SSE)", mi.GenerateRequest, None, mi.GenerateStreamFrame),
    Route("POST", "/v2/models/{model}/versions/{version}/generate", mindie.versions_unsupported,
          "Model versions: not supported (404)"),
    Route("POST", "/v2/models/{model}/versions/{version}/generate_stream",
          mindie.versions_unsupported, "Model versions: not supported (404)"),
    Route("POST", "/serving-endpoints/{name}/invocations", databricks.invocations,
          "Databricks Foundation Model API: chat, completions or embeddings by body shape",
          (dbx.DatabricksChatRequest, dbx.DatabricksCompletionRequest,
           dbx.DatabricksEmbeddingRequest),
          (oa.ChatCompletion, dbx.DatabricksCompletion, emb.DatabricksEmbeddingResponse),
          (oa.ChatCompletionChunk, dbx.DatabricksCompletion, DatabricksErrorBody)),
    Route("GET", "/v1/playground/info", playground.info,
          "The web playground's form limits and the queue (off with --no-playground)", None,
          playground.PlaygroundInfo),
    Route("GET", "/v1/playground/queue/{client_id}", playground.queue,
          "Where the request sent with this X-Ferrollm-Client-Id waits (the playground polls "
          "it)", None, playground.QueuePlace),
    Route("GET", "/health", ops.health, "Engine running"),
    Route("GET", "/v2/health/live", ops.live, "Process live"),
    Route("GET", "/v2/health/ready", ops.ready, "Engine loaded and making progress"),
    Route("GET", "/metrics", ops.metrics, "Prometheus metrics"),
)  # fmt: skip


def error_style(path: str) -> ErrorStyle:
    """Which API's error body a path gets (docs/api/common.md#error-bodies)."""
    if path.startswith("/v2/"):
        return ErrorStyle.MINDIE
    if path.startswith("/serving-endpoints/"):
        return ErrorStyle.DATABRICKS
    return ErrorStyle.OPENAI


class App:
    """The ASGI application. ``load`` builds the context at lifespan startup (the CLI's way);
    a ready ``ctx`` can be given instead (tests)."""

    def __init__(
        self,
        ctx: ServerContext | None = None,
        load: Callable[[], ServerContext] | None = None,
    ) -> None:
        if (ctx is None) == (load is None):
            raise ValueError("give exactly one of `ctx` and `load`")
        self._ctx = ctx
        self._load = load
        self._routes = [(r, r.pattern) for r in ROUTES]
        self._openapi = openapi_document(ROUTES)

    @property
    def ctx(self) -> ServerContext:
        """The server's context (after lifespan startup, when built by ``load``)."""
        if self._ctx is None:
            raise RuntimeError("the server has not started")
        return self._ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    if self._ctx is None and self._load is not None:
                        self._ctx = await asyncio.to_thread(self._load)
                        engine = self._ctx.engine
                        if isinstance(engine, AsyncEngine):
                            engine.on_death = exit_on_engine_death
                        else:  # the embedding engine's thread runs from the start
                            engine.watch(exit_on_engine_death)
                        on_termination(asyncio.get_running_loop(), self._on_termination)
                except Exception as e:
                    # A missing file, a bad format, an unsupported model or option (OSError,
                    # ValueError) is the user's to fix: one line, the traceback only in debug.
                    user_error = isinstance(e, (OSError, ValueError))
                    trace = not user_error or logger.isEnabledFor(logging.DEBUG)
                    logger.error("startup failed: %s", e, exc_info=trace)
                    # No message: Granian would log it a second time.
                    await send({"type": "lifespan.startup.failed", "message": ""})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._ctx is not None:
                    if not await self._ctx.guard.drain(self._ctx.config.drain_timeout):
                        self._end_in_flight()
                        await self._ctx.guard.wait_idle(ERROR_FLUSH_S)
                    self._ctx.engine.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _on_termination(self) -> None:
        """SIGTERM/SIGINT: drain from now, and end what is still running at the deadline."""
        ctx = self.ctx
        if ctx.guard.draining:
            return
        ctx.guard.start_drain()
        asyncio.get_running_loop().call_later(ctx.config.drain_timeout, self._end_in_flight)

    def _end_in_flight(self) -> None:
        """The drain timeout passed: every request still running ends with a 503 in its
        route's shape (an error event once its stream began), never a cut connection."""
        ctx = self.ctx
        timeout = ctx.config.drain_timeout
        error = ApiError(
            503,
            f"the server is shutting down and this request did not finish within the drain "
            f"timeout ({timeout:g} s)",
            code="shutting_down",
        )
        if num := ctx.engine.fail_in_flight(error):
            logger.warning("drain timeout (%g s): %d requests end with an error", timeout, num)

    def _match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        allowed = []
        for route, pattern in self._routes:
            match = pattern.match(path)
            if match is None:
                continue
            if route.method == method:
                return route, match.groupdict()
            allowed.append(route.method)
        if allowed:
            raise ApiError(
                405,
                f"method {method} is not allowed on {path}; use {', '.join(allowed)}",
                code="method_not_allowed",
                headers=((b"allow", ", ".join(allowed).encode()),),
            )
        raise ApiError(404, f"no route {method} {path}", code="not_found")

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        style = error_style(path)
        headers = header_map(scope)
        try:
            with self.ctx.guard.admit(path, headers):  # keys, per-key cap, drain
                await self._admitted(scope, headers, receive, send, style)
        except ApiError as e:
            await self._reject(send, style, e)

    async def _reject(self, send: Send, style: ErrorStyle, error: ApiError) -> None:
        """Answer with ``error`` in the route's shape, counted in the metrics by reason."""
        if self._ctx is not None:
            self._ctx.metrics.request_rejected(error.status, error.code)
        await _send_error(send, style, error)

    async def _admitted(
        self,
        scope: Scope,
        headers: dict[bytes, bytes],
        receive: Receive,
        send: Send,
        style: ErrorStyle,
    ) -> None:
        path = scope["path"]
        if scope["method"] == "GET":
            if path == "/openapi.json":
                await JSONResponse(self._openapi).send_to(send)
                return
            if (page := playground.page(self.ctx, path)) is not None:
                await page.send_to(send)
                return
        route, params = self._match(scope["method"], path)
        config = self.ctx.config
        body = b""
        if route.method == "POST":
            body = await read_body(headers, receive, config.max_body_size, config.body_read_timeout)
        request = Request(scope["method"], path, headers, body, params)
        work = asyncio.create_task(self._respond(route, request, send, style))
        watch = asyncio.create_task(_wait_for_disconnect(receive))
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            watch.cancel()
        else:
            logger.info("client disconnected from %s %s; aborting", request.method, path)
            work.cancel()
        await asyncio.gather(work, watch, return_exceptions=True)

    async def _respond(self, route: Route, request: Request, send: Send, style: ErrorStyle) -> None:
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            response = await route.handler(self.ctx, request)
            await response.send_to(tracked_send)
        except Exception as e:
            if started:  # too late for a status: the stream itself reported what it could
                logger.warning("response to %s failed after it began: %r", request.path, e)
                return
            await self._reject(send, style, to_api_error(e))


async def _send_error(send: Send, style: ErrorStyle, error: ApiError) -> None:
    body = error_body(style, error)
    await JSONResponse(body, error.status, error.headers).send_to(send)


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
