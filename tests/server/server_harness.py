"""The HTTP server in-process: one tiny engine per session, its ASGI app driven by httpx.

An `AsyncEngine` serves the one event loop that first uses it, so a single loop runs on a
background thread for the whole session and every test submits its coroutines there
(`Server.run`). Requests go through ``httpx.ASGITransport`` (no sockets), which buffers each
response whole: streamed bodies are checked as the bytes the app wrote.

Three apps share the engine: ``app`` (the defaults, a 64-token input limit, a 64 KiB body
limit), ``full_text_app`` (MindIE ``fullTextEnabled``) and ``mindie_offsets_app`` (MindIE's
``text_offset`` across choices).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import httpx

from ferrollm import validate
from ferrollm.config import EngineConfig
from ferrollm.engine import AsyncEngine, LLMEngine, RequestOutput
from ferrollm.server.app import App
from ferrollm.server.context import ServerContext
from ferrollm.server_config import ServerConfig
from ferrollm.tokenizer import Tokenizer

T = TypeVar("T")

#: The served name (the model directory's name would do; a fixed one reads better).
MODEL = "tiny"
MAX_MODEL_LEN = 256
MAX_INPUT_TOKENS = 64
MAX_BODY_BYTES = 64 * 1024
#: Seconds any one request may take in-process before a test fails instead of hanging.
REQUEST_TIMEOUT_S = 60.0

ROUTE_PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "generate": f"/v2/models/{MODEL}/generate",
    "generate_stream": f"/v2/models/{MODEL}/generate_stream",
    "databricks": f"/serving-endpoints/{MODEL}/invocations",
}


class Server:
    """The engine, its two apps, and the event-loop thread they run on."""

    def __init__(
        self,
        model_dir: Path,
        *,
        max_model_len: int = MAX_MODEL_LEN,
        max_input_tokens: int = MAX_INPUT_TOKENS,
        **engine_options: Any,
    ) -> None:
        config = EngineConfig(
            model=str(model_dir),
            device="cpu",
            dtype="float32",
            max_model_len=max_model_len,
            kv_cache_memory="8MiB",
            seed=0,
            **engine_options,
        )
        self.engine = AsyncEngine(LLMEngine.from_config(config))
        self.ctx = ServerContext.build(
            self.engine,
            ServerConfig(
                served_model_name=MODEL,
                max_input_tokens=max_input_tokens,
                max_body_bytes=MAX_BODY_BYTES,
            ),
        )
        self.full_text_ctx = ServerContext.build(
            self.engine, ServerConfig(served_model_name=MODEL, full_text=True)
        )
        self.app = App(ctx=self.ctx)
        self.full_text_app = App(ctx=self.full_text_ctx)
        #: MindIE's ``text_offset`` counting on across choices (``text_offset_mode``).
        self.mindie_offsets_app = App(
            ctx=ServerContext.build(
                self.engine, ServerConfig(served_model_name=MODEL, text_offset_mode="mindie")
            )
        )
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._clients = {
            id(app): self.run(_make_client(app))
            for app in (self.app, self.full_text_app, self.mindie_offsets_app)
        }

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = REQUEST_TIMEOUT_S) -> T:
        """Run ``coro`` on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def client(self, app: App | None = None) -> httpx.AsyncClient:
        """The httpx client of ``app`` (default: the main app; another app of this engine gets
        its client on first use); use it on the loop."""
        app = app or self.app
        if id(app) not in self._clients:
            self._clients[id(app)] = self.run(_make_client(app))
        return self._clients[id(app)]

    def post(
        self,
        path: str,
        body: Any = None,
        *,
        content: bytes | None = None,
        app: App | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """POST ``body`` as JSON (or raw ``content``) and wait for the whole response."""
        if content is None:
            content = json.dumps(body).encode()
        headers = {"content-type": "application/json", **(headers or {})}
        return self.run(self.client(app).post(path, content=content, headers=headers))

    def get(self, path: str, app: App | None = None) -> httpx.Response:
        return self.run(self.client(app).get(path))

    def request(self, method: str, path: str) -> httpx.Response:
        return self.run(self.client().request(method, path))

    def engine_run(self, route: str, body: dict[str, Any], prompt_ids: list[int]) -> RequestOutput:
        """``body`` straight through the engine (the params the server would use): the last
        output, the oracle a route's response is compared with."""
        params = validate(route, body, self.ctx.limits).with_prompt_tokens(len(prompt_ids))

        async def go() -> RequestOutput:
            last = None
            async for out in self.engine.generate(self.engine.request(prompt_ids, params)):
                last = out
            assert last is not None
            return last

        return self.run(go())

    def close(self) -> None:
        for client in self._clients.values():
            self.run(client.aclose())
        self.engine.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


async def _make_client(app: App) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


def sse_events(response: httpx.Response) -> list[str]:
    """The payloads of an SSE body, checking the framing exactly (docs/api/common.md#streaming):
    every event is ``data: <one line>`` and a blank line, nothing else."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    body = response.text
    assert body.endswith("\n\n"), body[-200:]
    events = body[:-2].split("\n\n")
    payloads = []
    for event in events:
        assert event.startswith("data: "), event
        payload = event[len("data: ") :]
        assert "\n" not in payload and not payload.startswith(" "), event
        payloads.append(payload)
    return payloads


def sse_json(response: httpx.Response, *, done: bool) -> list[dict[str, Any]]:
    """The JSON events of an SSE body; ``done``: whether it must end with ``data: [DONE]``
    (and have no other ``[DONE]``)."""
    payloads = sse_events(response)
    if done:
        assert payloads[-1] == "[DONE]"
        payloads = payloads[:-1]
    assert "[DONE]" not in payloads
    return [json.loads(p) for p in payloads]
