"""Operational routes: ``/v1/models``, health, ``/metrics`` and ``/openapi.json``."""

from __future__ import annotations

import msgspec

from ferrollm.server.context import ServerContext
from ferrollm.server.http import JSONResponse, Request, Response
from ferrollm.server.metrics import CONTENT_TYPE
from ferrollm.server.protocol.openai import ModelCard, ModelList

#: Seconds without a finished step, while requests wait, after which the engine is not ready.
STALL_S = 60.0


async def models(ctx: ServerContext, request: Request) -> Response:
    """``GET /v1/models``: the served model, then each loaded LoRA adapter with its directory
    as ``root`` and the base model as ``parent`` (as vLLM lists them); each card's
    ``modalities`` says what the model takes."""

    modalities = ["text"] if ctx.media is None else ctx.media.modalities

    def card(name: str, root: str, parent: str | None = None) -> ModelCard:
        max_len = ctx.limits.max_model_len
        return ModelCard(
            id=name, created=ctx.created, root=root, max_model_len=max_len, task=ctx.task,
            parent=parent, modalities=modalities,
        )  # fmt: skip

    cards = [card(ctx.model_name, ctx.model_name)]
    lora = ctx.lora
    if lora is not None:
        for name in lora.names():
            path = lora.path(name)
            root = name if path is None else str(path)
            cards.append(card(name, root, lora.parent(name) or ctx.model_name))
    return JSONResponse(msgspec.json.encode(ModelList(cards)))


async def health(ctx: ServerContext, request: Request) -> Response:
    """``GET /health``: 200 while the engine runs, 503 once it has stopped."""
    ok = ctx.engine.is_running
    return JSONResponse(b"{}" if ok else b'{"error": "engine stopped"}', 200 if ok else 503)


async def live(ctx: ServerContext, request: Request) -> Response:
    """``GET /v2/health/live``: the process answers."""
    return JSONResponse(b"{}")


async def ready(ctx: ServerContext, request: Request) -> Response:
    """``GET /v2/health/ready``: the engine is loaded, running and making progress."""
    stalled = ctx.engine.seconds_since_progress()
    if not ctx.engine.is_running:
        return JSONResponse(b'{"ready": false, "reason": "engine stopped"}', 503)
    if ctx.guard.draining:
        return JSONResponse(b'{"ready": false, "reason": "shutting down"}', 503)
    if stalled > STALL_S:
        body = msgspec.json.encode(
            {"ready": False, "reason": f"no engine step finished for {stalled:.0f} s"}
        )
        return JSONResponse(body, 503)
    return JSONResponse(b'{"ready": true}')


async def metrics(ctx: ServerContext, request: Request) -> Response:
    """``GET /metrics``: Prometheus exposition text."""
    return JSONResponse(ctx.metrics.render(), content_type=CONTENT_TYPE)
