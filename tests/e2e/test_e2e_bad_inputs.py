"""Bad inputs a hostile client sends, over the wire against a real server: a batch that could
never be admitted is a 413 naming ``prompt`` at once (not a retryable 503), and bodies whose
validation grew with the square of their size (a 50,000-property tool schema, 50,000 tools, a
logit_bias over the whole vocabulary) no longer stall the event loop: ``/health`` keeps
answering while they are processed.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from .e2e_support import MODEL, Server

#: The default ``--max-waiting-requests``.
MAX_WAITING_REQUESTS = 256
#: How long /health may take while a large body is processed (generous: not a timing test of
#: the machine; before the fix it took 6-18 s).
HEALTH_WITHIN_S = 1.0
NUM = 50_000


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"model": MODEL, "prompt": ["hi"] * 10_000, "max_tokens": 1}),
        (f"/serving-endpoints/{MODEL}/invocations", {"prompt": ["hi"] * 10_000, "max_tokens": 1}),
    ],
    ids=["v1", "databricks"],
)
def test_a_batch_no_idle_server_could_admit_is_a_413_naming_prompt(
    server: Server, path: str, body: dict[str, Any]
) -> None:
    response = server.http.post(path, json=body)
    assert response.status_code == 413, response.text
    assert "retry-after" not in response.headers
    text = response.text
    assert "`prompt` has 10000 entries" in text and f"at most {MAX_WAITING_REQUESTS}" in text
    if path.startswith("/v1"):
        assert response.json()["error"]["param"] == "prompt"
    # A batch that fits still runs, all of it.
    fits = {**body, "prompt": ["hi"] * 3}
    assert server.http.post(path, json=fits).status_code == 200


def _tool(name: str, num_properties: int) -> dict[str, Any]:
    properties = {f"p{i}": {"type": "string", "description": f"field {i}"} for i in range(
        num_properties)}  # fmt: skip
    parameters = {"type": "object", "properties": properties, "required": []}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            **extra}  # fmt: skip


BIG_BODIES = {
    "tool-schema": _chat(tools=[_tool("f", NUM)], tool_choice="none"),
    "many-tools": _chat(tools=[_tool(f"f{i}", 1) for i in range(NUM)], tool_choice="none"),
    "logit-bias": _chat(logit_bias={str(i): 0 for i in range(49_152)}),
}


@pytest.mark.parametrize("name", list(BIG_BODIES))
def test_health_answers_while_a_huge_body_is_processed(server: Server, name: str) -> None:
    latencies: list[float] = []
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=server.url, timeout=60.0) as client:
            while not done.is_set():
                started = time.monotonic()
                assert client.get("/health").status_code == 200
                latencies.append(time.monotonic() - started)
                time.sleep(0.05)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        response = server.http.post("/v1/chat/completions", json=BIG_BODIES[name])
    finally:
        done.set()
        prober.join(60)
    assert response.status_code == 200, response.text[:500]
    assert latencies and max(latencies) < HEALTH_WITHIN_S, (name, max(latencies))
