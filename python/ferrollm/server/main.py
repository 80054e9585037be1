"""Building the served app: engine + context, for the CLI's Granian worker and for tests."""

from __future__ import annotations

import json
import logging
import os

from ferrollm.config import EngineConfig
from ferrollm.server.app import App
from ferrollm.server.context import ServerContext
from ferrollm.server_config import ServerConfig, split_options

logger = logging.getLogger("ferrollm.server")


def build_context(engine_config: EngineConfig, server_config: ServerConfig) -> ServerContext:
    """Load the model and wrap the engine for serving (blocking: seconds to minutes)."""
    url = f"http://{server_config.host}:{server_config.port}"
    if engine_config.task == "embed":
        return _build_embed_context(engine_config, server_config, url)
    from ferrollm.engine import AsyncEngine

    engine = AsyncEngine.from_config(engine_config)
    ctx = ServerContext.build(engine, server_config)
    logger.info(
        "serving %r (task generate, max_model_len %d) at %s: /v1/chat/completions, "
        "/v1/completions, /v2/models/%s/generate[_stream], /serving-endpoints/%s/invocations",
        ctx.model_name,
        ctx.limits.max_model_len,
        url,
        ctx.model_name,
        ctx.model_name,
    )
    if server_config.playground:
        logger.info("the web playground is at %s/ (--no-playground: off)", url)
    if ctx.media is not None:
        policy = server_config.media_policy()
        logger.info(
            "the model takes %s; local media under %s, media URLs from %s",
            ", ".join(ctx.media.modalities),
            policy.allowed_local_media_path or "nowhere (--allowed-local-media-path)",
            ", ".join(sorted(policy.allowed_media_domains)) or "any public host",
        )
    return ctx


def _build_embed_context(
    engine_config: EngineConfig, server_config: ServerConfig, url: str
) -> ServerContext:
    from ferrollm.engine.embed_async import AsyncEmbedder

    embedder = AsyncEmbedder.from_config(engine_config)
    ctx = ServerContext.build(embedder, server_config)
    e = embedder.embedder
    logger.info(
        "serving %r (task embed: %d dimensions, %s pooling%s, max %d input tokens, %d tokens "
        "per step) on %s %s at %s: /v1/embeddings, /serving-endpoints/%s/invocations",
        ctx.model_name,
        e.dimensions,
        e.spec.pooling,
        ", normalized" if e.spec.normalize else "",
        ctx.limits.max_input_tokens,
        e.max_num_batched_tokens,
        e.device,
        next(e.model.parameters()).dtype,
        url,
        ctx.model_name,
    )
    return ctx


def app_from_env() -> App:
    """Granian's factory: the options the CLI put in ``FERROLLM_SERVE_OPTIONS``."""
    from ferrollm.cli import OPTIONS_ENV

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    engine_config, server_config = split_options(json.loads(os.environ.get(OPTIONS_ENV, "{}")))
    return App(load=lambda: build_context(engine_config, server_config))
