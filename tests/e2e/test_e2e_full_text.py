"""MindIE ``fullTextEnabled`` on (a second server, ``--full-text``): generate_stream frames and
``/v1`` chat deltas carry the cumulative text, and the final chat chunk adds ``full_text``;
completions and Databricks streams stay incremental, non-streaming bodies are unchanged
(docs/decisions.md#where-full-text-applies).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from .e2e_support import (
    MODEL,
    PROMPT,
    PROMPT_TOKENS,
    STORY,
    STORY_TOKENS,
    Oracle,
    Server,
    sse_payloads,
)


def events(server: Server, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = server.http.post(path, json=body)
    assert response.status_code == 200, response.text
    payloads = sse_payloads(response.content)
    if payloads[-1] == "[DONE]":
        payloads.pop()
    return [json.loads(p) for p in payloads]


def assert_cumulative(texts: list[str], final: str) -> None:
    assert texts[-1] == final
    for before, after in itertools.pairwise(texts):
        assert after.startswith(before), (before, after)
    assert len(set(texts)) > 1


def test_generate_stream_frames_are_cumulative(full_text_server: Server, oracle: Oracle) -> None:
    expected = oracle.complete(PROMPT, PROMPT_TOKENS).text
    body = {
        "id": "full-1",
        "text_input": PROMPT,
        "parameters": {"do_sample": False, "max_new_tokens": PROMPT_TOKENS, "details": True},
    }
    frames = events(full_text_server, f"/v2/models/{MODEL}/generate_stream", body)
    assert {f["id"] for f in frames} == {"full-1"}
    assert_cumulative([f["text_output"] for f in frames], expected)
    assert [f["details"]["generated_tokens"] for f in frames] == list(range(1, PROMPT_TOKENS + 1))
    assert frames[-1]["details"]["finish_reason"] == "length"
    assert all("finish_reason" not in f["details"] for f in frames[:-1])
    # Non-streaming: the complete text, as without fullText.
    whole = full_text_server.http.post(f"/v2/models/{MODEL}/generate", json=body)
    assert whole.json()["text_output"] == expected


def test_chat_stream_is_cumulative_with_full_text_last(
    full_text_server: Server, oracle: Oracle
) -> None:
    expected = oracle.chat(STORY, STORY_TOKENS).text
    body = {"model": MODEL, "messages": STORY, "temperature": 0, "max_tokens": STORY_TOKENS}
    chunks = events(full_text_server, "/v1/chat/completions", {**body, "stream": True})
    assert_cumulative([c["choices"][0]["delta"]["content"] for c in chunks], expected)
    assert chunks[-1]["full_text"] == expected
    assert all("full_text" not in c for c in chunks[:-1])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == STORY_TOKENS
    # Databricks chat streams stay incremental on the same server.
    dbx = events(
        full_text_server,
        f"/serving-endpoints/{MODEL}/invocations",
        {"messages": STORY, "temperature": 0, "max_tokens": STORY_TOKENS, "stream": True},
    )
    assert "".join(c["choices"][0]["delta"]["content"] or "" for c in dbx) == expected
    assert all("full_text" not in c for c in dbx)


def test_completions_stream_stays_incremental(full_text_server: Server, oracle: Oracle) -> None:
    expected = oracle.complete(PROMPT, PROMPT_TOKENS).text
    body = {"model": MODEL, "prompt": PROMPT, "temperature": 0, "max_tokens": PROMPT_TOKENS}
    chunks = events(full_text_server, "/v1/completions", {**body, "stream": True})
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected
