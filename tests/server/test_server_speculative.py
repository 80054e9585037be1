"""``--speculative ngram`` over HTTP: a server that verifies n-gram drafts answers exactly as
one that does not (greedy and seeded, streamed or not), and streams every accepted token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_harness import MODEL, Server, sse_json

from tiny_models import build_tiny_model

PROMPT = "one two three four, one two three four, one two three"


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    model_dir: Path = build_tiny_model("llama3", tmp_path_factory.mktemp("spec-model"))
    server = Server(model_dir, speculative="ngram", num_speculative_tokens=3)
    yield server
    server.close()


def body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": 32, **fields}


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 0.0, "ignore_eos": True},
        {"temperature": 0.9, "seed": 3, "n": 2, "logprobs": 1},
        {"temperature": 0.0, "stop": [" two"]},
    ],
)
def test_completions_match_the_server_without_speculation(
    server: Server, spec_server: Server, fields: dict[str, Any]
) -> None:
    want = server.post("/v1/completions", body(**fields))
    got = spec_server.post("/v1/completions", body(**fields))
    assert want.status_code == got.status_code == 200, got.text
    for a, b in zip(want.json()["choices"], got.json()["choices"], strict=True):
        assert (b["text"], b["finish_reason"]) == (a["text"], a["finish_reason"])
        if a["logprobs"] is not None:
            assert b["logprobs"]["tokens"] == a["logprobs"]["tokens"]
    # Streamed: the chunks add up to the same text.
    stream = spec_server.post("/v1/completions", body(stream=True, **fields))
    texts: dict[int, str] = {}
    for event in sse_json(stream, done=True):
        for choice in event["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert [texts[i] for i in sorted(texts)] == [c["text"] for c in want.json()["choices"]]
    scheduler = spec_server.engine.engine.scheduler
    assert scheduler.stats()["num_accepted_draft_tokens"] > 0
