"""Beam search over HTTP (docs/api/openai.md#beam-search): ``/v1/completions`` ``use_beam_search``
returns the ``n`` best hypotheses as choices, best first, each with its logprobs; streamed, it is
MindIE's "fake streaming": one event holding the whole response, then ``[DONE]``. The oracle is the
same search run straight through the engine (its equality with transformers is tested in
tests/engine/test_beam_search.py).
"""

from __future__ import annotations

from typing import Any

from server_harness import MODEL, ROUTE_PATHS, Server, sse_json

from ferrollm.engine import CompletionOutput

PROMPT = "who are you"


def body(**fields: Any) -> dict[str, Any]:
    """The completions beam-search sample (docs/api/common.md#sample-bodies), with this server's
    model name."""
    return {
        "model": MODEL,
        "prompt": PROMPT,
        "temperature": 1,
        "max_tokens": 5,
        "use_beam_search": True,
        "ignore_eos": True,
        "n": 2,
        "best_of": 2,
        "logprobs": 2,
        **fields,
    }


def oracle(server: Server, request: dict[str, Any]) -> list[CompletionOutput]:
    return server.engine_run("completions", request, server.tokenizer.encode(PROMPT)).outputs


def check_choices(server: Server, request: dict[str, Any], choices: list[dict[str, Any]]) -> None:
    expected = oracle(server, {**request, "stream": False})
    assert [c["index"] for c in choices] == list(range(request["n"]))
    assert [c["text"] for c in choices] == [c.text for c in expected]
    assert all(c["finish_reason"] == "length" for c in choices)
    for choice, hyp in zip(choices, expected, strict=True):
        lps = choice["logprobs"]
        assert hyp.logprobs is not None
        assert lps["token_logprobs"] == [lp.logprob for lp in hyp.logprobs]
        # Two alternatives per token (keyed by text, so two with the same text make one).
        assert all(1 <= len(top) <= 2 for top in lps["top_logprobs"])
        assert len(lps["tokens"]) == len(hyp.token_ids) == request["max_tokens"]
    scores = [h.score for h in expected]
    assert scores == sorted(scores, reverse=True), "best first"


def test_beam_search_returns_the_n_best_hypotheses(server: Server) -> None:
    request = body(n=2, best_of=4)
    response = server.post(ROUTE_PATHS["completions"], request)
    assert response.status_code == 200, response.text
    data = response.json()
    check_choices(server, request, data["choices"])
    # Per-choice text_offset (OpenAI's meaning): every choice counts from 0.
    assert all(c["logprobs"]["text_offset"][0] == 0 for c in data["choices"])
    num_tokens = sum(len(c["logprobs"]["tokens"]) for c in data["choices"])
    assert data["usage"]["completion_tokens"] == num_tokens == 2 * 5


def test_streamed_beam_search_is_one_event_with_everything(server: Server) -> None:
    request = body(stream=True)
    response = server.post(ROUTE_PATHS["completions"], request)
    (event,) = sse_json(response, done=True)
    assert event["object"] == "text_completion"
    check_choices(server, request, event["choices"])
    assert event["usage"]["completion_tokens"] == 2 * 5


def test_mindie_text_offsets_count_on_across_choices(server: Server) -> None:
    request = body(n=3, best_of=3)
    plain = server.post(ROUTE_PATHS["completions"], request).json()["choices"]
    mindie = server.post(ROUTE_PATHS["completions"], request, app=server.mindie_offsets_app).json()[
        "choices"
    ]
    base = 0
    for a, b in zip(plain, mindie, strict=True):
        assert b["text"] == a["text"]
        assert b["logprobs"]["text_offset"] == [base + o for o in a["logprobs"]["text_offset"]]
        base += len(a["text"])
    assert mindie[1]["logprobs"]["text_offset"][0] == len(plain[0]["text"]) > 0
