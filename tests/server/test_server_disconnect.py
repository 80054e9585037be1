"""A client that goes away aborts its request (docs/api/common.md#disconnects): the app is called
directly with a hand-written ASGI ``receive``/``send`` pair whose ``receive`` reports
``http.disconnect`` once the first body chunk has gone out (or, for a whole response, once the
engine has the request).

Each engine step is slowed to SLOW_STEP_S for these tests, so that the request could not have
run to its end within the DEADLINE_S the abort is given: finishing early means it was aborted.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from server_harness import MODEL, ROUTE_PATHS, Server, sse_json

SLOW_STEP_S = 0.01
MAX_TOKENS = 200  # >= MAX_TOKENS * SLOW_STEP_S = 2 s to run to the end
DEADLINE_S = 1.0

BODIES: dict[str, dict[str, Any]] = {
    "chat": {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}],
             "max_tokens": MAX_TOKENS, "ignore_eos": True},
    "completions": {"model": MODEL, "prompt": "Hello", "max_tokens": MAX_TOKENS,
                    "ignore_eos": True},
    "generate_stream": {"id": "gone-1", "text_input": "Hello",
                        "parameters": {"max_new_tokens": MAX_TOKENS}},
    "generate": {"id": "gone-2", "text_input": "Hello",
                 "parameters": {"max_new_tokens": MAX_TOKENS}},
    "databricks": {"prompt": "Hello", "max_tokens": MAX_TOKENS},
}  # fmt: skip


@pytest.fixture
def slow_engine(server: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    engine = server.engine.engine
    step = engine.step

    def slow_step() -> Any:
        time.sleep(SLOW_STEP_S)
        return step()

    monkeypatch.setattr(engine, "step", slow_step)
    return server


def scope(path: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
    }


async def disconnect_after(
    server: Server, route: str, body: dict[str, Any], *, stream: bool
) -> tuple[list[dict[str, Any]], float]:
    """Run the request; the client leaves after the first body chunk (``stream``) or once the
    engine has the request. Returns what the app sent and when the client left."""
    engine = server.engine.engine
    gone = asyncio.Event()
    messages: list[dict[str, Any]] = []
    request_sent = False
    left_at = 0.0

    async def receive() -> dict[str, Any]:
        nonlocal request_sent, left_at
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": json.dumps(body).encode()}
        if stream:
            await gone.wait()
        else:
            while engine.num_unfinished_requests == 0:
                await asyncio.sleep(0.005)
        left_at = time.monotonic()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            gone.set()

    # No exception escapes the app, and it returns promptly.
    await asyncio.wait_for(server.app(scope(ROUTE_PATHS[route]), receive, send), DEADLINE_S)
    return messages, left_at


async def settled(server: Server, baseline_blocks: int) -> float:
    """Seconds until the engine holds no request and its KV blocks are back to the baseline."""
    start = time.monotonic()
    engine = server.engine
    while engine.engine.num_unfinished_requests or (
        engine.stats()["num_used_blocks"] != baseline_blocks
    ):
        if time.monotonic() - start > 5:
            break
        await asyncio.sleep(0.005)
    return time.monotonic() - start


@pytest.mark.parametrize(
    ("route", "stream"),
    [
        ("chat", True),
        ("completions", True),
        ("generate_stream", True),
        ("databricks", True),
        ("chat", False),
        ("generate", False),
    ],
)
def test_disconnect_aborts(slow_engine: Server, route: str, stream: bool) -> None:
    server = slow_engine
    stats = server.engine.stats()
    assert server.engine.engine.num_unfinished_requests == 0
    baseline_blocks, steps_before = stats["num_used_blocks"], stats["num_steps"]
    body = (
        {**BODIES[route], "stream": True}
        if stream and route != "generate_stream"
        else (BODIES[route])
    )

    async def scenario() -> tuple[list[dict[str, Any]], float, float]:
        messages, left_at = await disconnect_after(server, route, body, stream=stream)
        waited = await settled(server, baseline_blocks)
        return messages, time.monotonic() - left_at, waited

    messages, since_left, waited = server.run(scenario())
    assert since_left < DEADLINE_S + 0.5
    assert server.engine.engine.num_unfinished_requests == 0
    assert server.engine.stats()["num_used_blocks"] == baseline_blocks
    assert waited < DEADLINE_S, f"the request was still running {waited:.2f} s later"
    steps = server.engine.stats()["num_steps"] - steps_before
    assert steps < MAX_TOKENS // 2, steps  # aborted, not run to its end
    assert not server.engine.client_ids  # a client id is released
    if stream:
        assert messages[0]["type"] == "http.response.start" and messages[0]["status"] == 200
        bodies = b"".join(m.get("body", b"") for m in messages[1:])
        assert bodies.startswith(b"data: ")
        assert b"[DONE]" not in bodies  # the stream was cut, not finished
    else:
        assert messages == []  # nothing is sent to a client that left
    # And the server serves the next request.
    normal = {**BODIES[route], "stream": False} if route != "generate_stream" else BODIES[route]
    normal = (
        {**normal, "max_tokens": 2}
        if "max_tokens" in normal
        else {**normal, "parameters": {"max_new_tokens": 2}}
    )
    response = server.post(ROUTE_PATHS[route], normal)
    assert response.status_code == 200, response.text


def test_timeout_ends_the_request(slow_engine: Server) -> None:
    """MindIE ``parameters.timeout`` (docs/decisions.md#request-timeouts): a stream ends with a
    ``stop_sequence`` frame with empty text and ``err_msg``; the whole-response route answers
    504."""
    server = slow_engine
    body = {"text_input": "Hello", "parameters": {"max_new_tokens": MAX_TOKENS, "timeout": 1}}
    frames = sse_json(server.post(ROUTE_PATHS["generate_stream"], body), done=False)
    last = frames[-1]
    assert len(frames) < MAX_TOKENS
    assert last["details"]["finish_reason"] == "stop_sequence"
    assert last["text_output"] == ""
    assert last["err_msg"] == "request timed out after 1 s"
    assert all("err_msg" not in f and "finish_reason" not in f.get("details", {})
               for f in frames[:-1])  # fmt: skip
    response = server.post(ROUTE_PATHS["generate"], body)
    assert response.status_code == 504, response.text
    assert response.json() == {"error": "request timed out after 1 s", "error_type": "timeout"}
    assert server.engine.engine.num_unfinished_requests == 0
