"""SIGTERM under CPU load: every accepted request finishes within ``--drain-timeout`` or ends
with its route's error event; no connection is cut, and the server exits 0 before Granian's
kill.

Two busy processes keep both cores loaded for the whole test (bounded in time), so the server
is slower than the drain window: the streams cannot finish and must be ended by the server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ferrollm.server.transport import KILL_MARGIN_S

from .e2e_support import MODEL, Server, launch_server, sse_payloads

DRAIN_TIMEOUT_S = 3
#: Each busy loop ends by itself after this many seconds, whatever happens to the test.
BURN_S = 240
_BURN = f"import time\nend = time.monotonic() + {BURN_S}\nwhile time.monotonic() < end: pass\n"
LONG_TOKENS = 4000


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """Both cores busy in other processes."""
    burners = [subprocess.Popen([sys.executable, "-c", _BURN]) for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    server = launch_server(tmp_path, "--drain-timeout", str(DRAIN_TIMEOUT_S))
    server.http = httpx.Client(base_url=server.url, timeout=120.0)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def _v1_ended_with_error(payloads: list[str]) -> dict[str, Any]:
    """The stream's last event before ``[DONE]``, which must follow it."""
    assert payloads[-1] == "[DONE]", payloads[-3:]
    last: dict[str, Any] = json.loads(payloads[-2])
    return last


def _check_v1(payloads: list[str]) -> None:
    last = _v1_ended_with_error(payloads)
    assert last["choices"][-1]["finish_reason"] == "stop", last
    assert "shutting down" in last["err_msg"], last


def _check_mindie(payloads: list[str]) -> None:
    last = json.loads(payloads[-1])  # MindIE streams have no [DONE]
    assert last["details"]["finish_reason"] == "stop_sequence", last
    assert "shutting down" in last["err_msg"], last


def _check_databricks(payloads: list[str]) -> None:
    last = _v1_ended_with_error(payloads)  # an error event, then [DONE]
    assert last["error_code"] == "TEMPORARILY_UNAVAILABLE", last
    assert "shutting down" in last["message"], last


#: (path, body, how its stream must end) per API.
STREAMS: list[tuple[str, dict[str, Any], Callable[[list[str]], None]]] = [
    (
        "/v1/completions",
        {"model": MODEL, "prompt": "Once", "max_tokens": LONG_TOKENS, "ignore_eos": True,
         "stream": True},
        _check_v1,
    ),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}],
         "max_tokens": LONG_TOKENS, "ignore_eos": True, "stream": True},
        _check_v1,
    ),
    (
        f"/v2/models/{MODEL}/generate_stream",
        {"text_input": "Once", "parameters": {"max_new_tokens": LONG_TOKENS,
                                              "ignore_eos": True}},
        _check_mindie,
    ),
    (
        f"/serving-endpoints/{MODEL}/invocations",
        {"messages": [{"role": "user", "content": "Tell a long story."}],
         "max_tokens": LONG_TOKENS, "stream": True},
        _check_databricks,
    ),
]  # fmt: skip


def test_sigterm_under_load_ends_unfinished_streams_with_their_error_event(
    server: Server, cpu_load: None
) -> None:
    results: dict[str, httpx.Response | BaseException] = {}
    first_bytes = threading.Barrier(len(STREAMS) + 1)

    def stream(path: str, body: dict[str, Any]) -> None:
        try:
            with server.http.stream("POST", path, json=body) as r:
                chunks = r.iter_bytes()
                head = next(chunks)
                first_bytes.wait(120)
                results[path] = httpx.Response(r.status_code, content=head + b"".join(chunks))
        except BaseException as e:
            results[path] = e
            first_bytes.abort()

    def whole() -> None:  # a non-streamed request: its error is the whole (503) response
        body = {"model": MODEL, "prompt": "Once", "max_tokens": LONG_TOKENS, "ignore_eos": True}
        try:
            results["whole"] = server.http.post("/v1/completions", json=body)
        except BaseException as e:
            results["whole"] = e

    threads = [threading.Thread(target=stream, args=(p, b)) for p, b, _ in STREAMS]
    threads.append(threading.Thread(target=whole))
    for t in threads:
        t.start()
    first_bytes.wait(120)  # every stream is under way
    deadline = time.monotonic() + 60
    while server.metric("ferrollm_requests_in_flight") < len(threads):  # the whole one too
        assert time.monotonic() < deadline, "the requests were not all admitted"
        time.sleep(0.1)
    signalled = time.monotonic()
    os.kill(server.process.pid, signal.SIGTERM)
    for t in threads:
        t.join(120)
    assert server.process.wait(60) == 0
    elapsed = time.monotonic() - signalled
    assert elapsed < DRAIN_TIMEOUT_S + KILL_MARGIN_S, elapsed
    for path, _, check in STREAMS:
        result = results[path]
        assert isinstance(result, httpx.Response), f"{path}: {result!r}"  # never cut
        assert result.status_code == 200, path
        check(sse_payloads(result.content))
    whole_result = results["whole"]
    assert isinstance(whole_result, httpx.Response), repr(whole_result)
    assert whole_result.status_code == 503, whole_result.text
    assert whole_result.json()["error"]["code"] == "shutting_down"
    log = server.log()
    assert "Killing worker" not in log, f"{elapsed:.1f} s after SIGTERM:\n{log}"
    assert "requests end with an error" in log, log
