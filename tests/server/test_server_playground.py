"""The web playground's routes (docs/serving.md#the-playground): its page and assets are
served without a key while keys are configured, ``/v1/playground/info`` needs one like every
``/v1`` route, and ``playground=False`` (``--no-playground``) makes all of them 404. The page
itself is driven in a real browser by tests/e2e/test_e2e_playground.py."""

from __future__ import annotations

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
