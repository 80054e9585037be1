"""The web playground's routes (docs/serving.md#the-playground): its page and assets are
served without a key while keys are configured, ``/v1/playground/info`` needs one like every
``/v1`` route, and ``playground=False`` (``--no-playground``) makes all of them 404. The page
itself is driven in a real browser by tests/e2e/test_e2e_playground.py."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
from server_harness import MODEL, Server

from ferrollm.server.app import App
from ferrollm.server.context import ServerContext
from ferrollm.server.playground import ASSETS
from ferrollm.server_config import ServerConfig

KEY = "playground-key"


def _client(server: Server, **options: Any) -> httpx.AsyncClient:
    ctx = ServerContext.build(server.engine, ServerConfig(served_model_name=MODEL, **options))
    app = App(ctx=ctx)

    async def make() -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")

    return server.run(make())


def test_the_page_and_its_assets_need_no_key_but_the_api_does(server: Server) -> None:
    client = _client(server, api_keys=(KEY,))
    page = server.run(client.get("/"))
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    # Everything the page loads is one of the assets, from this server (no CDN, no fonts).
    linked = set(re.findall(r'(?:src|href)="(/[^"]*)"', page.text))
    assert linked == {"/playground/playground.js", "/playground/playground.css"}
    assert not re.search(r"https?://", page.text)
    for path, (_, content_type) in ASSETS.items():
        response = server.run(client.get(path))
        assert response.status_code == 200, path
        assert response.headers["content-type"] == content_type, path
        assert not re.search(r"(?:src|href|import)[^\n]*https?://", response.text), path
    script = server.run(client.get("/playground/playground.js")).text
    for module in ("stream.js", "transcript.js"):  # the modules it imports are assets too
        assert f'from "./{module}"' in script
    for path in ("/v1/playground/info", "/v1/models", "/playground/other.js"):
        assert server.run(client.get(path)).status_code == 401, path
    headers = {"authorization": f"Bearer {KEY}"}
    info = server.run(client.get("/v1/playground/info", headers=headers))
    assert info.status_code == 200
    body = info.json()
    assert body["model"] == MODEL and body["max_logprobs"] == 20
    assert body["max_iter_times"] == body["max_model_len"] and body["num_waiting"] == 0
    # POST to the page is not routed.
    assert server.run(client.post("/", headers=headers)).status_code == 404
    server.run(client.aclose())


def test_no_playground_serves_none_of_it(server: Server) -> None:
    client = _client(server, playground=False)
    for path in (*ASSETS, "/v1/playground/info"):
        response = server.run(client.get(path))
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "not_found"
    assert server.run(client.get("/v1/models")).status_code == 200
    keyed = _client(server, playground=False, api_keys=(KEY,))
    assert server.run(keyed.get("/")).status_code == 401  # no longer a public path
    server.run(client.aclose())
    server.run(keyed.aclose())


def test_a_client_id_header_names_the_request_and_its_queue_place(server: Server) -> None:
    """``X-Ferrollm-Client-Id`` gives a /v1 generation the client's own id: the queue route
    answers for it (null once it has run), a bad value or a completion batch is a 400 naming
    the header, and one id names one request in flight at a time (409)."""
    client = _client(server)
    header = "X-Ferrollm-Client-Id"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    done = server.run(client.post("/v1/chat/completions", json=chat, headers={header: "pg-1"}))
    assert done.status_code == 200, done.text
    place = server.run(client.get("/v1/playground/queue/pg-1")).json()
    assert place == {
        "client_id": "pg-1",
        "queue_position": None,
        "num_waiting": 0,
        "num_in_flight": place["num_in_flight"],
    }
    for bad in ("", "a b", "x" * 129, "é"):
        response = server.run(
            client.post("/v1/chat/completions", json=chat, headers={header: bad.encode()})
        )
        assert response.status_code == 400, bad
        assert response.json()["error"]["param"] == header
    batch = {"model": MODEL, "prompt": ["a", "b"], "max_tokens": 1}
    response = server.run(client.post("/v1/completions", json=batch, headers={header: "pg-2"}))
    assert response.status_code == 400 and response.json()["error"]["param"] == header
    one = {"model": MODEL, "prompt": "a", "max_tokens": 1}
    response = server.run(client.post("/v1/completions", json=one, headers={header: "pg-2"}))
    assert response.status_code == 200, response.text

    async def twice() -> list[httpx.Response]:
        slow = {**chat, "max_tokens": 160, "ignore_eos": True}
        first = asyncio.create_task(
            client.post("/v1/chat/completions", json=slow, headers={header: "pg-3"})
        )
        while "pg-3" not in server.engine.client_ids:  # in the engine, running
            await asyncio.sleep(0.002)
        second = await client.post("/v1/chat/completions", json=chat, headers={header: "pg-3"})
        return [await first, second]

    first, second = server.run(twice())
    assert first.status_code == 200, first.text
    assert second.status_code == 409, second.text
    assert second.json()["error"]["param"] == header
    server.run(client.aclose())
