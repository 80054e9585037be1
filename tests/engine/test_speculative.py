"""Speculative decoding end to end on a tiny model (parity mode: float32, no quantization).

A request's ``draft_tokens`` are verified in one step and never change a greedy output, only
the number of steps; with ``draft_logits`` at temperature > 0 the output is still distributed
as the target model's (a chi-square test over many seeded runs, deterministic under its fixed
seeds); ``speculative="ngram"`` gives the same outputs as decoding without it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from ferrollm import LLM, SamplingParams
from ferrollm.config import EngineConfig, EngineConfigError
from ferrollm.engine import EngineRequest
from ferrollm.engine.outputs import RequestOutput

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "one two three one two three one two",
    "Hello, world!",
]
OPTIONS = {"dtype": "float32", "quantization": "none", "max_num_seqs": 64, "seed": 0}


@pytest.fixture(scope="module")
def model_dir(tiny_model_factory: Callable[..., Path]) -> Path:
    return tiny_model_factory("llama3")


@pytest.fixture(scope="module")
def plain(model_dir: Path) -> LLM:
    return LLM(model_dir, **OPTIONS)


@pytest.fixture(scope="module")
def ngram(model_dir: Path) -> LLM:
    return LLM(model_dir, speculative="ngram", **OPTIONS)


def run(llm: LLM, requests: list[EngineRequest]) -> tuple[dict[str, RequestOutput], int]:
    """Every request to completion: the final outputs by id, and the steps it took."""
    for request in requests:
        llm.engine.add_request(request)
    done: dict[str, RequestOutput] = {}
    steps = 0
    while llm.engine.has_unfinished_requests():
        steps += 1
        for out in llm.engine.step():
            assert isinstance(out, RequestOutput), out
            if out.finished:
                done[out.request_id] = out
    return done, steps


def greedy_ids(
    llm: LLM, prompt: str, draft: list[int] | None, max_tokens: int = 16
) -> tuple[list[int], int]:
    ids = llm.get_tokenizer().encode(prompt)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    request = EngineRequest.of("r", ids, params, draft_tokens=draft)
    done, steps = run(llm, [request])
    return list(done["r"].outputs[0].token_ids), steps


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_output_is_the_same_with_a_correct_a_garbage_or_no_draft(
    plain: LLM, prompt: str
) -> None:
    want, plain_steps = greedy_ids(plain, prompt, None)
    assert len(want) == 16
    vocab = plain.engine.model_config.vocab_size
    garbage = [(t + 7) % vocab for t in want]
    half_right = want[:5] + garbage[5:]
    stats_before = plain.engine.scheduler.stats()
    for draft in ([], garbage, half_right, want[:3]):
        got, _ = greedy_ids(plain, prompt, draft)
        assert got == want, draft
    got, steps = greedy_ids(plain, prompt, want)
    assert got == want
    # A correct draft of all 16 tokens: 15 accepted and the last one drawn in one step.
    assert steps == 1 < plain_steps == 16
    after = plain.engine.scheduler.stats()
    assert after["num_draft_tokens"] > stats_before["num_draft_tokens"]


def test_ngram_speculation_gives_the_same_outputs_and_saves_steps(plain: LLM, ngram: LLM) -> None:
    tokenizer = plain.get_tokenizer()
    params = [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=24),
        SamplingParams(temperature=0.0, repetition_penalty=1.2, max_tokens=24),
        SamplingParams(temperature=1.0, n=2, seed=5, max_tokens=24, logprobs=2),
        SamplingParams(temperature=0.0, stop=["fox"], max_tokens=24),
    ]

    def batch() -> list[EngineRequest]:
        return [
            EngineRequest.of(f"{i}-{j}", tokenizer.encode(prompt), p)
            for i, prompt in enumerate(PROMPTS)
            for j, p in enumerate(params)
        ]

    want, plain_steps = run(plain, batch())
    before = ngram.engine.scheduler.stats()
    got, steps = run(ngram, batch())
    for request_id, out in want.items():
        for a, b in zip(out.outputs, got[request_id].outputs, strict=True):
            assert (b.token_ids, b.text, b.finish_reason) == (a.token_ids, a.text, a.finish_reason)
            if a.logprobs is not None:
                assert b.logprobs is not None
                for x, y in zip(a.logprobs, b.logprobs, strict=True):
                    assert x.token_id == y.token_id
                    assert [t for t, _ in x.top] == [t for t, _ in y.top]
                    assert [lp for _, lp in x.top] == pytest.approx(
                        [lp for _, lp in y.top], abs=1e-4
                    )
    after = ngram.engine.scheduler.stats()
    assert after["num_accepted_draft_tokens"] > before["num_accepted_draft_tokens"]
    # The batch takes as many steps as its slowest request, which may accept nothing.
    assert steps <= plain_steps
    ngram.engine.scheduler.check_invariants()


def test_draft_logits_keep_the_target_distribution(model_dir: Path) -> None:
    llm = LLM(model_dir, logprobs_mode="processed", **OPTIONS)
    vocab = llm.engine.model_config.vocab_size
    ids = llm.get_tokenizer().encode(PROMPTS[0])
    sampling = {"temperature": 0.7, "top_k": 12}
    # The target's distribution at the draft's position: processed logprobs of all top_k.
    (probe,) = llm.generate(PROMPTS[0], SamplingParams(max_tokens=1, logprobs=12, **sampling))
    p = np.zeros(vocab)
    for token, logprob in probe.outputs[0].logprobs[0].top:
        p[token] = np.exp(logprob)
    assert p.sum() == pytest.approx(1.0, abs=1e-4)
    # A drafter that is roughly right on the support and puts some mass elsewhere.
    rng = np.random.default_rng(1234)
    support = np.flatnonzero(p)
    q_logits = np.full(vocab, -1.0, dtype=np.float32)
    q_logits[support] = np.log(p[support]) + rng.normal(0.0, 1.0, support.size) + 3.0
    q = np.exp(q_logits - q_logits.max())
    q /= q.sum()
    num_runs = 3000
    drafts = rng.choice(vocab, size=num_runs, p=q)
    requests = [
        EngineRequest.of(
            str(i),
            ids,
            SamplingParams(max_tokens=2, seed=i, **sampling),
            draft_tokens=[int(drafts[i])],
            draft_logits=q_logits[None, :],
        )
        for i in range(num_runs)
    ]
    before = llm.engine.scheduler.stats()
    done, _ = run(llm, requests)
    first = np.array([done[str(i)].outputs[0].token_ids[0] for i in range(num_runs)])
    counts = np.bincount(first, minlength=vocab)
    assert counts[p == 0].sum() == 0, "a token the target rules out was emitted"
    chi2 = float((((counts[support] - num_runs * p[support]) ** 2) / (num_runs * p[support])).sum())
    assert chi2 < stats.chi2.ppf(0.999, support.size - 1), (chi2, counts[support], p[support])
    after = llm.engine.scheduler.stats()
    accepted = after["num_accepted_draft_tokens"] - before["num_accepted_draft_tokens"]
    assert after["num_draft_tokens"] - before["num_draft_tokens"] == num_runs
    # Accepted with probability sum_x min(p(x), q(x)).
    assert accepted / num_runs == pytest.approx(np.minimum(p, q).sum(), abs=0.04)


def test_bad_drafts_and_options_are_refused_naming_the_field(plain: LLM) -> None:
    ids = plain.get_tokenizer().encode("hi")
    vocab = plain.engine.model_config.vocab_size
    bad = [
        ({"draft_tokens": [vocab]}, SamplingParams(), "draft_tokens"),
        (
            {"draft_tokens": [1], "draft_logits": np.zeros((1, vocab + 1), np.float32)},
            SamplingParams(),
            "draft_logits",
        ),
        ({"draft_logits": np.zeros((1, vocab), np.float32)}, SamplingParams(), "draft_logits"),
        (
            {"draft_tokens": [1]},
            SamplingParams(use_beam_search=True, best_of=2, temperature=0.0),
            "draft_tokens",
        ),
    ]
    for fields, params, field in bad:
        with pytest.raises(ValueError, match=field) as info:
            plain.engine.add_request(EngineRequest.of("bad", ids, params, **fields))
        assert getattr(info.value, "param", field) == field
    assert not plain.engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="draft_logits"):
        EngineRequest.of("x", ids, draft_tokens=[1], draft_logits=[1.0, 2.0])
    for options, field in [
        ({"speculative": "eagle"}, "speculative"),
        ({"speculative": "ngram", "ngram_min": 3, "ngram_max": 2}, "ngram_max"),
        ({"speculative": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ]:
        with pytest.raises(EngineConfigError) as error:
            EngineConfig(**options)
        assert error.value.field == field
