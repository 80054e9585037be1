"""A client that goes away has its request aborted and its KV blocks freed
(docs/api/common.md#disconnects).

A long request (1500 tokens, ignore_eos) holds KV blocks; once the client closes the connection
(a stream read for a few events, or a non-streaming request whose client times out), the
server must notice, abort the request at the engine's next step and give the blocks back:
``ferrollm_kv_blocks_used`` returns to its baseline within a second (polled every 50 ms).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from .e2e_support import MODEL, STORY, Server

#: How long the server may take to free a gone client's blocks, and how often it is checked.
FREE_WITHIN_S = 1.0
POLL_S = 0.05
LONG = 1500

#: route -> (path, a body asking for LONG tokens). Greedy, on prompts whose greedy output runs
#: past 200 tokens without EOS, so the request is surely still running when the client leaves
#: (Databricks and MindIE have no ignore_eos).
STREAMS: dict[str, tuple[str, dict[str, Any]]] = {
    "v1-completions": (
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": "Once upon a time",
            "max_tokens": LONG,
            "ignore_eos": True,
            "temperature": 0,
        },
    ),
    "v1-chat": (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": STORY,
            "max_tokens": LONG,
            "ignore_eos": True,
            "temperature": 0,
        },
    ),
    "generate_stream": (
        f"/v2/models/{MODEL}/generate_stream",
        {
            "text_input": "Once upon a time",
            "parameters": {"max_new_tokens": LONG, "do_sample": False},
        },
    ),
    "databricks-chat": (
        f"/serving-endpoints/{MODEL}/invocations",
        {"messages": STORY, "max_tokens": LONG, "temperature": 0},
    ),
}
#: The routes whose streaming is a body field.
_STREAM_FLAG = {"v1-completions", "v1-chat", "databricks-chat"}


def blocks_in_use(server: Server) -> float:
    return server.metric("ferrollm_kv_blocks_used")


def wait_for_baseline(server: Server, baseline: float, since: float) -> float:
    """Seconds from ``since`` until the blocks in use are back to ``baseline``; fails if that
    takes longer than FREE_WITHIN_S."""
    while True:
        used = blocks_in_use(server)
        elapsed = time.monotonic() - since
        if used == baseline:
            return elapsed
        if elapsed > FREE_WITHIN_S:
            pytest.fail(
                f"{used:g} KV blocks still in use {elapsed:.2f} s after the client left "
                f"(baseline {baseline:g}); server log:\n{server.log()[-4000:]}"
            )
        time.sleep(POLL_S)


@pytest.mark.parametrize("route", list(STREAMS))
def test_closing_a_stream_aborts_the_request(server: Server, route: str) -> None:
    path, body = STREAMS[route]
    if route in _STREAM_FLAG:
        body = {**body, "stream": True}
    baseline = blocks_in_use(server)
    generated_before = server.metric("ferrollm_generation_tokens_total")
    with (
        httpx.Client(base_url=server.url, timeout=60) as client,
        client.stream("POST", path, json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()  # held: closing it would close the connection
        events = 0
        while events < 3:
            events += next(lines).startswith("data: ")
        assert blocks_in_use(server) > baseline  # the request holds its blocks
        assert server.metric("ferrollm_num_requests_running") == 1
        # Leaving the `with` closes the response unread: the connection is gone.
    closed = time.monotonic()
    wait_for_baseline(server, baseline, closed)
    assert server.metric("ferrollm_num_requests_running") == 0
    generated = server.metric("ferrollm_generation_tokens_total") - generated_before
    assert 3 <= generated < LONG


def test_a_non_streaming_client_that_times_out_aborts_the_request(server: Server) -> None:
    path, body = STREAMS["v1-completions"]
    baseline = blocks_in_use(server)

    async def run() -> float:
        async with httpx.AsyncClient(base_url=server.url, timeout=1.0) as client:
            request = asyncio.create_task(client.post(path, json=body))
            # Wait (off the event loop) until the request holds blocks, while it runs.
            held = False
            while not request.done() and not held:
                held = await asyncio.to_thread(blocks_in_use, server) > baseline
                await asyncio.sleep(POLL_S)
            assert held, "the request never held a KV block before the client gave up"
            with pytest.raises(httpx.ReadTimeout):
                await request
            return time.monotonic()

    gave_up = asyncio.run(run())
    wait_for_baseline(server, baseline, gave_up)
    assert server.metric("ferrollm_num_requests_running") == 0
    # And the server still serves.
    response = server.http.post(
        "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 1}
    )
    assert response.status_code == 200, response.text
