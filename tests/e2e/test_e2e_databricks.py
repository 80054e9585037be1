"""Databricks ``POST /serving-endpoints/{name}/invocations`` over raw HTTP (docs/api/databricks.md):
chat and completions by body shape, streamed (ending with ``[DONE]``) and not."""

from __future__ import annotations

import json
from typing import Any

from .e2e_support import (
    CODE_PROMPT,
    MODEL,
    PROMPT,
    PROMPT_TOKENS,
    STORY,
    STORY_TOKENS,
    Oracle,
    Server,
    sse_payloads,
)

URL = f"/serving-endpoints/{MODEL}/invocations"
PROMPTS = [PROMPT, CODE_PROMPT]


def stream_chunks(server: Server, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = server.http.post(URL, json={**body, "stream": True})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(response.content)
    assert payloads[-1] == "[DONE]" and "[DONE]" not in payloads[:-1]
    return [json.loads(p) for p in payloads[:-1]]


def test_chat(server: Server, oracle: Oracle) -> None:
    expected = oracle.chat(STORY, STORY_TOKENS)
    body = {"messages": STORY, "temperature": 0, "max_tokens": STORY_TOKENS}
    response = server.http.post(URL, json=body)
    assert response.status_code == 200, response.text
    completion = response.json()
    # No MindIE extensions on this route.
    assert set(completion) == {"id", "object", "created", "model", "choices", "usage"}
    assert completion["object"] == "chat.completion" and completion["model"] == MODEL
    (choice,) = completion["choices"]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == expected.text
    assert choice["finish_reason"] == expected.finish_reason
    num_prompt = len(oracle.tokenizer.encode_chat(STORY))
    num_completion = len(expected.token_ids)
    assert completion["usage"] == {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
    }

    chunks = stream_chunks(server, body)
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == expected.text
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == expected.finish_reason
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["usage"] == completion["usage"]
    assert all("usage" not in c or c["usage"] is None for c in chunks[:-1])
    assert all("prefill_time" not in c for c in chunks)


def test_completions_batch(server: Server, oracle: Oracle) -> None:
    expected = oracle.run([(p, PROMPT_TOKENS) for p in PROMPTS])
    body = {"prompt": PROMPTS, "temperature": 0, "max_tokens": PROMPT_TOKENS}
    response = server.http.post(URL, json=body)
    assert response.status_code == 200, response.text
    completion = response.json()
    assert completion["object"] == "text_completion" and completion["model"] == MODEL
    assert [c["index"] for c in completion["choices"]] == [0, 1]
    assert [c["text"] for c in completion["choices"]] == [e.text for e in expected]
    assert [c["finish_reason"] for c in completion["choices"]] == [
        e.finish_reason for e in expected
    ]
    num_prompt = sum(len(oracle.tokenizer.encode(p)) for p in PROMPTS)
    num_completion = sum(len(e.token_ids) for e in expected)
    assert completion["usage"] == {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
    }

    chunks = stream_chunks(server, body)
    texts = ["", ""]
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["text"]
    assert texts == [e.text for e in expected]
    assert chunks[-1]["usage"] == completion["usage"]


def test_rejections_in_the_databricks_shape(server: Server) -> None:
    cases = [
        (URL, {"messages": STORY, "top_k": 0}, 400, "BAD_REQUEST", "top_k"),
        (URL, {"prompt": "Hi", "temperature": 2.5}, 400, "BAD_REQUEST", "temperature"),
        (URL, {"input": ["a text"]}, 400, "BAD_REQUEST", "does not support the embeddings task"),
        (URL, {"prompt": "Hi", "messages": STORY}, 400, "BAD_REQUEST", "exactly one"),
        (
            "/serving-endpoints/no-such-endpoint/invocations",
            {"prompt": "Hi"},
            404,
            "RESOURCE_DOES_NOT_EXIST",
            "no-such-endpoint",
        ),
    ]
    for path, body, status, code, needle in cases:
        response = server.http.post(path, json=body)
        assert response.status_code == status, (body, response.text)
        error = response.json()
        assert set(error) == {"error_code", "message"}
        assert error["error_code"] == code and needle in error["message"], error
    ok = server.http.post(URL, json={"prompt": "Hi", "max_tokens": 1})
    assert ok.status_code == 200, ok.text
