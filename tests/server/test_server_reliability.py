"""API keys, the per-key cap, deadlines, admission and engine death, over HTTP in-process.

Apps with their own `ServerConfig` share the session's engine (keys, caps and deadlines live
in the server, not the engine); the engine-death test builds an engine of its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_harness import MODEL, ROUTE_PATHS, Server, sse_json

from ferrollm.config import EngineConfig, EngineConfigError
from ferrollm.engine import AsyncEngine, LLMEngine
from ferrollm.server.app import App
from ferrollm.server.auth import KeyRing, load_api_keys
from ferrollm.server.context import ServerContext
from ferrollm.server.errors import ApiError
from ferrollm.server.overload import Admission
from ferrollm.server_config import ServerConfig
from tiny_models import build_tiny_model

KEYS = ("key-one", "key-two")
BODIES: dict[str, dict[str, Any]] = {
    "chat": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    "completions": {"model": MODEL, "prompt": "Hello", "max_tokens": 2},
    "generate": {"text_input": "Hello", "parameters": {"max_new_tokens": 2}},
    "generate_stream": {"text_input": "Hello", "parameters": {"max_new_tokens": 2}},
    "databricks": {"prompt": "Hello", "max_tokens": 2},
}


def _app(server: Server, **options: Any) -> tuple[App, httpx.AsyncClient]:
    ctx = ServerContext.build(server.engine, ServerConfig(served_model_name=MODEL, **options))
    app = App(ctx=ctx)

    async def make() -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")

    return app, server.run(make())


def _post(
    server: Server, client: httpx.AsyncClient, route: str, body: Any, key: str | None = None
) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key is not None else {}
    return server.run(client.post(ROUTE_PATHS[route], json=body, headers=headers))


def assert_error_shape(route: str, response: httpx.Response, status: int, kind: str) -> str:
    """The route's own error body (docs/api/common.md#error-bodies) with ``kind`` as its type/code;
    the message."""
    assert response.status_code == status, response.text
    body = response.json()
    if route in ("chat", "completions"):
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["type"] == kind, body
        return str(body["error"]["message"])
    if route.startswith("generate"):
        assert set(body) == {"error", "error_type"} and body["error_type"] == kind, body
        return str(body["error"])
    assert set(body) == {"error_code", "message"} and body["error_code"] == kind, body
    return str(body["message"])


_UNAUTHORIZED = {
    "chat": "authentication_error",
    "completions": "authentication_error",
    "generate": "unauthorized",
    "generate_stream": "unauthorized",
    "databricks": "UNAUTHENTICATED",
}


@pytest.fixture(scope="module")
def keyed(server: Server) -> Iterator[tuple[App, httpx.AsyncClient]]:
    app, client = _app(server, api_keys=KEYS)
    yield app, client
    server.run(client.aclose())


@pytest.mark.parametrize("route", list(BODIES))
def test_a_missing_or_wrong_key_is_a_401_in_the_routes_shape(
    server: Server,
    keyed: tuple[App, httpx.AsyncClient],
    route: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, client = keyed
    with caplog.at_level(logging.WARNING, logger="ferrollm.server"):
        for key in (None, "key-on", "key-one-", "KEY-ONE", ""):
            response = _post(server, client, route, BODIES[route], key)
            message = assert_error_shape(route, response, 401, _UNAUTHORIZED[route])
            assert "Bearer" in message
            assert response.headers["www-authenticate"].startswith("Bearer")
        basic = server.run(
            client.post(
                ROUTE_PATHS[route], json=BODIES[route], headers={"authorization": "Basic a2V5"}
            )
        )
        assert_error_shape(route, basic, 401, _UNAUTHORIZED[route])
    for key in KEYS:
        assert _post(server, client, route, BODIES[route], key).status_code == 200
    assert all(k not in caplog.text for k in ("key-on", "key-one", "KEY-ONE"))  # never logged


def test_public_paths_need_no_key_and_are_configurable(
    server: Server, keyed: tuple[App, httpx.AsyncClient]
) -> None:
    _, client = keyed
    for path in ("/health", "/v2/health/live", "/v2/health/ready", "/metrics", "/openapi.json"):
        assert server.run(client.get(path)).status_code == 200, path
    assert server.run(client.get("/v1/models")).status_code == 401
    _, strict = _app(server, api_keys=KEYS, public_paths=("/health",))
    assert server.run(strict.get("/health")).status_code == 200
    assert server.run(strict.get("/metrics")).status_code == 401
    assert server.run(strict.get("/openapi.json")).status_code == 401
    headers = {"authorization": f"Bearer {KEYS[1]}"}
    assert server.run(strict.get("/metrics", headers=headers)).status_code == 200
    server.run(strict.aclose())


def test_keys_come_from_flags_a_file_and_the_environment(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# ops keys\nfile-key\n\n  spaced-key  \nflag-key\n")
    config = ServerConfig(api_keys=("flag-key",), api_key_file=str(key_file))
    environ = {"FERROLLM_API_KEYS": "env-a, env-b env-c"}
    assert load_api_keys(config, environ) == [
        "flag-key", "file-key", "spaced-key", "env-a", "env-b", "env-c"
    ]  # fmt: skip
    assert not KeyRing(ServerConfig(), {}).enabled
    assert KeyRing(ServerConfig(), {"FERROLLM_API_KEYS": "k"}).enabled
    with pytest.raises(EngineConfigError, match="api_key_file"):
        ServerConfig(api_key_file=str(tmp_path / "missing"))
    with pytest.raises(EngineConfigError, match="api_keys"):
        ServerConfig(api_keys=("",))


def test_a_key_over_its_concurrency_cap_gets_429_and_other_keys_do_not(server: Server) -> None:
    app, client = _app(server, api_keys=KEYS, max_concurrent_per_key=1)
    long = {"model": MODEL, "prompt": "Hello", "max_tokens": 150, "ignore_eos": True}
    headers_one = {"authorization": f"Bearer {KEYS[0]}"}

    async def go() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        first = asyncio.create_task(
            client.post(ROUTE_PATHS["completions"], json=long, headers=headers_one)
        )
        while app.ctx.guard.num_in_flight == 0:  # the first request holds key one's slot
            await asyncio.sleep(0.001)
        second = await client.post(ROUTE_PATHS["completions"], json=long, headers=headers_one)
        other = await client.post(
            ROUTE_PATHS["completions"],
            json=BODIES["completions"],
            headers={"authorization": f"Bearer {KEYS[1]}"},
        )
        return await first, second, other

    first, second, other = server.run(go())
    assert first.status_code == 200, first.text
    message = assert_error_shape("completions", second, 429, "rate_limit_error")
    assert "max_concurrent_per_key" in message
    assert other.status_code == 200
    # the slot is free again
    assert _post(server, client, "completions", BODIES["completions"], KEYS[0]).status_code == 200
    server.run(client.aclose())


# ---- deadlines -------------------------------------------------------------------------------


def _num_used_blocks(server: Server) -> int:
    return server.engine.stats()["num_used_blocks"]


_TIMEOUT = {
    "chat": "timeout",
    "completions": "timeout",
    "generate": "timeout",
    "databricks": "DEADLINE_EXCEEDED",
}


@pytest.mark.parametrize("route", ["chat", "completions", "databricks"])
def test_the_server_deadline_ends_a_whole_response_with_504(server: Server, route: str) -> None:
    # A deadline shorter than any step: the request times out in the queue (queue time counts).
    # (MindIE requests always carry their own `timeout`, 600 s by default: tests/e2e.)
    _, client = _app(server, request_timeout=1e-6)
    body = {**BODIES[route]}
    response = _post(server, client, route, body)
    message = assert_error_shape(route, response, 504, _TIMEOUT[route])
    assert "timed out" in message
    assert _num_used_blocks(server) == 0  # the KV blocks are back
    server.run(client.aclose())


@pytest.mark.parametrize("route", ["chat", "completions", "databricks"])
def test_a_deadline_ends_a_stream_with_the_routes_timeout_frame(server: Server, route: str) -> None:
    # (MindIE's own `timeout` is whole seconds: tests/e2e covers generate_stream's frame.)
    # Databricks has no `ignore_eos`: the tiny model may end at EOS within 50 ms, so its
    # deadline is shorter than a step.
    _, client = _app(server, request_timeout=0.001 if route == "databricks" else 0.05)
    body = {**BODIES[route], "stream": True, "max_tokens": 240, "ignore_eos": True}
    response = _post(server, client, route, body)
    events = sse_json(response, done=True)
    # chunks without err_msg, then an error event (docs/api/common.md#errors-after-a-stream-began)
    if route == "databricks":
        assert events[-1].get("error_code") == "DEADLINE_EXCEEDED", events[-3:]
        assert "timed out" in events[-1]["message"]
        events = events[:-1]
        # no chunk claims a normal end: the error event is the stream's end
        # (docs/api/databricks.md#error-behavior)
        reasons = [c["finish_reason"] for e in events for c in e.get("choices", [])]
        assert set(reasons) == {None} and not any("err_msg" in e for e in events), events[-2:]
    else:
        finals = [e for e in events if e.get("err_msg")]
        assert len(finals) == 1 and finals[0] is events[-1], events[-3:]
        assert "timed out" in finals[0]["err_msg"]
        reasons = [c["finish_reason"] for e in events for c in e.get("choices", [])]
        assert reasons[-1] == "stop" and "length" not in reasons
    assert _num_used_blocks(server) == 0
    server.run(client.aclose())


DATABRICKS_CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 240}


def test_a_deadline_ends_a_databricks_chat_stream_with_an_error_event(server: Server) -> None:
    _, client = _app(server, request_timeout=0.001)  # shorter than a step (no ignore_eos)
    body = {**DATABRICKS_CHAT, "stream": True}
    events = sse_json(_post(server, client, "databricks", body), done=True)
    assert events[-1]["error_code"] == "DEADLINE_EXCEEDED", events[-1]
    assert "timed out" in events[-1]["message"]
    chunks = events[:-1]
    assert all(c["finish_reason"] is None for e in chunks for c in e["choices"]), chunks[-2:]
    assert not any("err_msg" in e for e in chunks)
    whole = _post(server, client, "databricks", DATABRICKS_CHAT)
    assert_error_shape("databricks", whole, 504, "DEADLINE_EXCEEDED")
    assert _num_used_blocks(server) == 0
    server.run(client.aclose())


@pytest.mark.parametrize("stream", [False, True])
def test_a_deadline_under_error_behavior_truncate_returns_the_partial_text_as_length(
    server: Server, stream: bool
) -> None:
    """docs/api/databricks.md#error-behavior, docs/decisions.md#what-truncate-does: on timeout,
    "truncate" returns the text so far, finish "length"."""
    _, client = _app(server, request_timeout=0.001)  # shorter than a step (no ignore_eos)
    body = {"prompt": "Hello", "max_tokens": 240, "error_behavior": "truncate", "stream": stream}
    response = _post(server, client, "databricks", body)
    assert response.status_code == 200, response.text
    if stream:
        events = sse_json(response, done=True)
        assert all("error_code" not in e for e in events), events[-1]
        reasons = [c["finish_reason"] for e in events for c in e["choices"]]
        assert reasons[-1] == "length" and reasons.count("length") == 1, reasons[-3:]
    else:
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] == "length", choice
    assert _num_used_blocks(server) == 0
    server.run(client.aclose())


@pytest.mark.parametrize("route", ["chat", "completions", "databricks"])
def test_the_timeout_extra_overrides_the_server_default(server: Server, route: str) -> None:
    _, client = _app(server, request_timeout=1e-6)
    ok = _post(server, client, route, {**BODIES[route], "timeout": 60})
    assert ok.status_code == 200, ok.text
    late = _post(server, client, route, {**BODIES[route], "timeout": 1e-6, "max_tokens": 5})
    assert late.status_code == 504
    bad = _post(server, client, route, {**BODIES[route], "timeout": 0})
    assert bad.status_code == 400 and "`timeout` must be in (0, 3600]" in bad.text, bad.text
    server.run(client.aclose())


# ---- admission -------------------------------------------------------------------------------


@pytest.mark.parametrize("route", list(BODIES))
def test_a_full_queue_answers_503_with_retry_after_in_the_routes_shape(
    server: Server, route: str
) -> None:
    app, client = _app(server, max_waiting_requests=1)
    app.ctx.admission.num_waiting = 1  # as if one request waited for its first step
    try:
        response = _post(server, client, route, BODIES[route])
    finally:
        app.ctx.admission.num_waiting = 0
    kind = {"chat": "service_unavailable", "completions": "service_unavailable"}.get(
        route, "TEMPORARILY_UNAVAILABLE" if route == "databricks" else "overloaded"
    )
    message = assert_error_shape(route, response, 503, kind)
    assert "max_waiting_requests" in message
    assert int(response.headers["retry-after"]) >= 1
    assert app.ctx.admission.num_rejected == 1
    assert _post(server, client, route, BODIES[route]).status_code == 200
    server.run(client.aclose())


def test_admission_counts_waiting_tokens_and_retry_after_follows_the_drain_rate() -> None:
    admission = Admission(ServerConfig(max_waiting_requests=10, max_waiting_tokens=100))
    with admission.waiting(5000) as big:  # alone in the queue: admitted however large
        assert admission.num_waiting_tokens == 5000
        with pytest.raises(Exception, match="max_waiting_tokens"):
            admission.check(1)
        big.started()
    assert (admission.num_waiting, admission.num_waiting_tokens) == (0, 0)
    assert admission.retry_after() == 1  # nothing measured yet
    now = time.monotonic()
    admission._departures.clear()
    admission._departures.extend([now - 10 + i for i in range(11)])  # 1 request/s
    admission.num_waiting = 4
    retry = admission.retry_after()
    assert 5 <= retry <= 6, retry  # 5 requests ahead at ~1/s (and the clock moved on)


def test_a_batch_that_could_not_wait_in_an_idle_server_is_a_413_naming_prompt() -> None:
    admission = Admission(ServerConfig(max_waiting_requests=10, max_waiting_tokens=100))
    admission.check_batch(10)
    admission.check_batch(10, 100)
    admission.check_batch(1, 5000)  # one request alone may exceed the token bound
    with pytest.raises(ApiError, match=r"`prompt` has 11 entries; .*at most 10") as count:
        admission.check_batch(11)
    with pytest.raises(ApiError, match=r"`prompt` holds 101 prompt tokens .*at most 100") as tokens:
        admission.check_batch(2, 101)
    for error in (count.value, tokens.value):
        assert (error.status, error.param) == (413, "prompt") and not error.headers
    assert admission.num_rejected == 0  # a 413 is not overload


# ---- engine death ----------------------------------------------------------------------------


class _Fatal(BaseException):
    """What no request handling catches."""


def test_engine_thread_death_fails_in_flight_requests_and_turns_health_503(
    tmp_path: Path, server: Server
) -> None:
    model_dir = build_tiny_model("llama3", tmp_path)
    config = EngineConfig(
        model=str(model_dir), device="cpu", dtype="float32", max_model_len=64,
        kv_cache_memory="2MiB",
    )  # fmt: skip
    engine = AsyncEngine(LLMEngine.from_config(config))
    deaths: list[BaseException] = []
    engine.on_death = deaths.append
    step = engine.engine.step
    num_steps = 0

    def dying_step() -> Any:
        nonlocal num_steps
        num_steps += 1
        if num_steps == 3:
            raise _Fatal("injected")
        return step()

    engine.engine.step = dying_step  # type: ignore[method-assign]
    ctx = ServerContext.build(engine, ServerConfig(served_model_name=MODEL))
    app = App(ctx=ctx)

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t"
        ) as client:
            long = {"model": MODEL, "prompt": "Hi", "max_tokens": 40, "ignore_eos": True}
            streamed = await client.post(ROUTE_PATHS["completions"], json={**long, "stream": True})
            whole = await client.post(ROUTE_PATHS["completions"], json=long)
            health = await client.get("/health")
            ready = await client.get("/v2/health/ready")
            return [whole, streamed, health, ready]

    try:
        whole, streamed, health, ready = server.run(go())
    finally:
        engine.shutdown()
    # The stream had begun: it ends with an error chunk and [DONE], not a hang or a cut.
    events = sse_json(streamed, done=True)
    assert "engine" in events[-1]["err_msg"], events[-1]
    # A request after the death is refused at once.
    assert whole.status_code == 503 and "engine" in whole.json()["error"]["message"]
    assert (health.status_code, ready.status_code) == (503, 503)
    assert len(deaths) == 1 and isinstance(deaths[0], _Fatal)


# ---- hostile input ---------------------------------------------------------------------------

HOSTILE = {
    "deeply nested": b'{"prompt": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
    "NaN": b'{"prompt": "x", "temperature": NaN}',
    "Infinity": b'{"prompt": "x", "temperature": 1e999}',
    "a huge integer": b'{"prompt": "x", "max_tokens": ' + b"9" * 4000 + b"}",
    "invalid UTF-8": b'{"prompt": "\xff\xfe"}',
    "a lone surrogate": b'{"prompt": "\\ud800"}',
    "not an object": b"[1, 2]",
    "truncated": b'{"prompt": "x", "max_tok',
}


@pytest.mark.parametrize("route", list(BODIES))
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_bodies_get_a_400_never_a_500(server: Server, route: str, name: str) -> None:
    body = HOSTILE[name]
    if route.startswith("generate"):
        body = body.replace(b'"prompt"', b'"text_input"')
    response = server.post(ROUTE_PATHS[route], content=body)
    assert response.status_code == 400, (name, response.text)
    assert server.post(ROUTE_PATHS[route], BODIES[route]).status_code == 200
