"""``best_of`` > ``n`` end to end on a tiny model (parity mode: float32, no quantization).

The oracle is the same seeded request with ``n = best_of`` and logprobs on: seeded draws are
keyed by (seed, sample index, position), so its samples are exactly the ``best_of`` candidates,
and ranking them by the sum of their logprobs gives the ``n`` that must come back, best first.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ferrollm import LLM, SamplingParams
from ferrollm.engine import CompletionOutput, EngineRequest

PROMPT = "The quick brown fox jumps over the lazy dog."
BEST_OF = 5
#: Fields shared by the request and its oracle (a high temperature spreads the candidates).
SEEDED = {"temperature": 1.3, "max_tokens": 10, "seed": 4321}


@pytest.fixture(scope="module")
def llm(tiny_model_factory: Callable[..., Path]) -> LLM:
    return LLM(tiny_model_factory("llama3"), dtype="float32", quantization="none", max_num_seqs=8)


def ranked(candidates: list[CompletionOutput]) -> list[CompletionOutput]:
    """Best first: highest sum of logprobs, then lowest index."""
    assert all(c.logprobs is not None for c in candidates)
    return sorted(
        candidates, key=lambda c: (-math.fsum(lp.logprob for lp in c.logprobs or ()), c.index)
    )


@pytest.fixture(scope="module")
def sampling(llm: LLM) -> dict[str, Any]:
    """SEEDED with stop token ids that end two of the candidates early (tokens they draw)."""
    (probe,) = llm.generate(PROMPT, SamplingParams(n=BEST_OF, best_of=BEST_OF, **SEEDED))
    stops = [probe.outputs[0].token_ids[2], probe.outputs[3].token_ids[5]]
    return {**SEEDED, "stop_token_ids": stops}


@pytest.fixture(scope="module")
def oracle(llm: LLM, sampling: dict[str, Any]) -> list[CompletionOutput]:
    params = SamplingParams(n=BEST_OF, best_of=BEST_OF, logprobs=0, **sampling)
    (out,) = llm.generate(PROMPT, params)
    assert len({tuple(c.token_ids) for c in out.outputs}) == BEST_OF, "the candidates differ"
    lengths = [len(c.token_ids) for c in out.outputs]
    assert min(lengths) < SEEDED["max_tokens"] == max(lengths), "some end early, some do not"
    best = ranked(out.outputs)
    assert [c.index for c in best] != list(range(BEST_OF)), "ranking reorders them"
    return best


@pytest.mark.parametrize("n", [1, 2, 4])
def test_best_of_returns_the_top_n_by_cumulative_logprob(
    llm: LLM, sampling: dict[str, Any], oracle: list[CompletionOutput], n: int
) -> None:
    (out,) = llm.generate(PROMPT, SamplingParams(n=n, best_of=BEST_OF, **sampling))
    assert out.finished
    assert [c.index for c in out.outputs] == list(range(n))
    assert [c.token_ids for c in out.outputs] == [c.token_ids for c in oracle[:n]]
    assert [c.text for c in out.outputs] == [c.text for c in oracle[:n]]
    assert [c.finish_reason for c in out.outputs] == [c.finish_reason for c in oracle[:n]]
    # Ranked without logprobs asked for: no entries come back, the sum does.
    assert all(c.logprobs is None for c in out.outputs)
    sums = [c.cumulative_logprob for c in out.outputs]
    assert sums == [o.cumulative_logprob for o in oracle[:n]]
    assert sums == sorted(sums, reverse=True)  # type: ignore[type-var]


def test_asked_logprobs_come_back_for_the_returned_choices(
    llm: LLM, sampling: dict[str, Any], oracle: list[CompletionOutput]
) -> None:
    params = SamplingParams(n=2, best_of=BEST_OF, logprobs=2, **sampling)
    (out,) = llm.generate(PROMPT, params)
    for got, want in zip(out.outputs, oracle[:2], strict=True):
        assert got.logprobs is not None and want.logprobs is not None
        assert [lp.token_id for lp in got.logprobs] == want.token_ids
        assert [lp.logprob for lp in got.logprobs] == [lp.logprob for lp in want.logprobs]
        assert all(len(lp.top) == 2 for lp in got.logprobs)
        # The whole sequence is new in the one output that shows it.
        assert got.new_token_ids == got.token_ids and got.new_text == got.text
        assert got.new_logprobs == got.logprobs


def test_candidates_stay_hidden_and_an_abort_returns_the_best_of_what_exists(llm: LLM) -> None:
    engine = llm.engine
    params = SamplingParams(n=2, best_of=BEST_OF, temperature=1.0, max_tokens=50, seed=3)
    engine.add_request(EngineRequest.of("hidden", llm.get_tokenizer().encode(PROMPT), params))
    for _ in range(4):
        (progress,) = engine.step()
        assert not progress.finished
        assert progress.outputs == [], "no candidate is shown before the request finishes"
    assert engine.abort_request("hidden")
    (final,) = engine.step()
    assert final.finished
    assert [c.index for c in final.outputs] == [0, 1]
    assert all(c.finish_reason == "abort" for c in final.outputs)
    # The candidates as they were after 4 tokens: the same draws, cut at 4 tokens.
    cut = SamplingParams(n=BEST_OF, best_of=BEST_OF, temperature=1.0, max_tokens=4, seed=3,
                         logprobs=0)  # fmt: skip
    (so_far,) = llm.generate(PROMPT, cut)
    best = ranked(so_far.outputs)[:2]
    assert [c.token_ids for c in final.outputs] == [c.token_ids for c in best]
    assert [c.cumulative_logprob for c in final.outputs] == [c.cumulative_logprob for c in best]
    assert not engine.has_unfinished_requests()
