"""One intake: every route's body is walked once (parsed in Rust, duplicate keys found in the
same pass), whatever route or task it is, and validation alone refuses what this build does
not serve."""

from __future__ import annotations

from typing import Any

import pytest
from server_harness import MODEL, ROUTE_PATHS, Server

from ferrollm._core import _num_body_walks

CHAT = [{"role": "user", "content": "Hi"}]
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("chat", {"model": MODEL, "messages": CHAT, "max_tokens": 2}),
    "completions": ("completions", {"model": MODEL, "prompt": ["a", "b"], "max_tokens": 2}),
    "generate": ("generate", {"text_input": "Hello", "parameters": {"max_new_tokens": 2}}),
    "databricks-chat": ("databricks", {"messages": CHAT, "max_tokens": 2}),
    "databricks-completions": ("databricks", {"prompt": "Hello", "max_tokens": 2}),
}


@pytest.mark.parametrize("name", list(BODIES))
def test_each_body_is_walked_once(server: Server, name: str) -> None:
    route, body = BODIES[name]
    before = _num_body_walks()
    response = server.post(ROUTE_PATHS[route], body)
    assert response.status_code == 200, response.text
    assert _num_body_walks() - before == 1


def test_a_refused_feature_and_a_duplicate_key_cost_one_walk_too(server: Server) -> None:
    before = _num_body_walks()
    unsupported = {"model": MODEL, "prompt": "a", "suffix": "!"}
    response = server.post(ROUTE_PATHS["completions"], unsupported)
    assert response.status_code == 400 and response.json()["error"]["code"] == "unsupported"
    duplicate = b'{"model": "tiny", "prompt": "a", "prompt": "b"}'
    response = server.post(ROUTE_PATHS["completions"], content=duplicate)
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
    assert _num_body_walks() - before == 2
