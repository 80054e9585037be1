"""``best_of`` > ``n`` over HTTP (docs/api/openai.md#n-best-of-and-beam-search): ``/v1/completions``
generates ``best_of`` seeded candidates and returns the ``n`` with the highest cumulative logprob,
best first, as indices 0..n-1; usage counts the returned choices only. The oracle is the same
request with ``n = best_of`` and logprobs, straight through the engine. Chat and Databricks have no
``best_of`` field (unknown fields are ignored there, docs/api/common.md#request-bodies); streaming
needs best_of == n (see test_server_rejections).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from server_harness import MODEL, ROUTE_PATHS, Server

from ferrollm.engine import CompletionOutput

PROMPT = "The quick brown fox"
BEST_OF = 4
NUM_TOKENS = 6


def body(**fields: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": NUM_TOKENS,
        "temperature": 1.2,
        "seed": 2024,
        "ignore_eos": True,
        **fields,
    }


def oracle(server: Server, n: int) -> list[CompletionOutput]:
    """The ``best_of`` candidates, sampled as ``n = best_of`` with logprobs; the best ``n``."""
    request = body(n=BEST_OF, best_of=BEST_OF, logprobs=0)
    candidates = server.engine_run("completions", request, server.tokenizer.encode(PROMPT)).outputs
    assert len({tuple(c.token_ids) for c in candidates}) == BEST_OF

    def key(c: CompletionOutput) -> tuple[float, int]:
        return (-math.fsum(lp.logprob for lp in c.logprobs or ()), c.index)

    return sorted(candidates, key=key)[:n]


@pytest.mark.parametrize("n", [1, 2])
def test_completions_best_of_returns_the_best_n(server: Server, n: int) -> None:
    response = server.post(ROUTE_PATHS["completions"], body(n=n, best_of=BEST_OF))
    assert response.status_code == 200, response.text
    got = response.json()
    choices = got["choices"]
    assert [c["index"] for c in choices] == list(range(n))
    assert [c["text"] for c in choices] == [c.text for c in oracle(server, n)]
    assert all(c["logprobs"] is None for c in choices), "logprobs were not asked for"
    usage = got["usage"]
    prompt_tokens = len(server.tokenizer.encode(PROMPT))
    # Only the returned choices count, not the best_of candidates
    # (docs/api/openai.md#n-best-of-and-beam-search).
    assert usage["completion_tokens"] == n * NUM_TOKENS
    assert usage["total_tokens"] == prompt_tokens + n * NUM_TOKENS
    # One entry per step of the longest candidate (docs/decisions.md#per-step-usage-arrays), though
    # none was shown before the end.
    assert len(usage["batch_size"]) == len(usage["queue_wait_time"]) == NUM_TOKENS
    assert usage["batch_size"][1:] == [BEST_OF] * (NUM_TOKENS - 1)


def test_completions_best_of_logprobs_belong_to_the_returned_choices(server: Server) -> None:
    response = server.post(ROUTE_PATHS["completions"], body(n=2, best_of=BEST_OF, logprobs=1))
    choices = response.json()["choices"]
    for choice, want in zip(choices, oracle(server, 2), strict=True):
        assert want.logprobs is not None
        lp = choice["logprobs"]
        assert lp["token_logprobs"] == pytest.approx([e.logprob for e in want.logprobs])
        assert len(lp["top_logprobs"]) == NUM_TOKENS
        assert lp["text_offset"][0] == 0  # each choice counts its own offsets
