"""`EngineRequest` through the engine: the arrival it carries is the clock of deadlines, and
streamed logprobs travel with the text of their tokens (the tracker's one hold-back)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ferrollm import LLM, SamplingParams
from ferrollm.engine import EngineRequest, RequestOutput


@pytest.fixture(scope="module")
def llm(tiny_model_factory: Callable[..., Path]) -> LLM:
    return LLM(tiny_model_factory("llama3"), compile="off")  # compiled: test_compiled_decode


def run(llm: LLM, request: EngineRequest) -> list[RequestOutput]:
    """Every output of ``request``, stepping the engine until it finishes."""
    llm.engine.add_request(request)
    outputs: list[RequestOutput] = []
    while not (outputs and outputs[-1].finished):
        outputs += [o for o in llm.engine.step() if o.request_id == request.request_id]
    return outputs


def test_the_deadline_counts_from_the_requests_arrival(llm: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, timeout_s=5.0)
    ids = llm.engine.tokenizer.encode("Hello world")
    fresh = run(llm, EngineRequest.of("fresh", ids, params))
    assert fresh[-1].outputs[0].finish_reason == "length"
    # Arrived (at the HTTP server, say) 6 s ago with a 5 s budget: over before it is scheduled.
    late = EngineRequest("late", np.asarray(ids, np.uint32), params, time.perf_counter() - 6.0)
    (out,) = run(llm, late)
    assert out.outputs[0].finish_reason == "timeout"
    assert out.outputs[0].token_ids == []


def test_streamed_logprobs_come_with_the_text_of_their_tokens(llm: LLM) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    (plain,) = llm.generate("The quick brown fox", greedy)
    tokens = plain.outputs[0].token_ids
    decode = llm.engine.tokenizer.decode
    # A stop string that starts with one token's whole text and can never match: that token's
    # text is held back (a possible stop) until the next token shows it is not one.
    held = next(
        i for i in range(1, len(tokens) - 1) if (t := decode([tokens[i]])).isascii() and t.strip()
    )
    params = SamplingParams(
        temperature=0,
        max_tokens=16,
        ignore_eos=True,
        logprobs=2,
        stop=[decode([tokens[held]]) + "\x01"],
    )
    ids = llm.engine.tokenizer.encode("The quick brown fox")
    outputs = run(llm, EngineRequest.of("lp", ids, params))
    steps = [o.outputs[0] for o in outputs]
    assert steps[-1].token_ids == tokens  # the stop never matched
    holding = [c for c in steps if c.new_token_ids and not c.new_text and not c.finished]
    assert holding, "the held token's step released no text"
    assert all(c.new_logprobs == [] for c in holding)
    for c in steps:
        if c.new_logprobs:
            assert c.new_text or c.finished
    released = [e for c in steps for e in (c.new_logprobs or [])]
    assert released == steps[-1].logprobs
    assert [e.token_id for e in released] == tokens
    # Each entry came with its token's bytes and text, and its alternatives'.
    detok = llm.engine.tokenizer.detokenizer
    for e in released:
        assert (e.token_bytes, e.text) == (
            detok.token_bytes(e.token_id),
            detok.token_text(e.token_id),
        )
        assert len(e.top) == 2
        assert e.top_texts == tuple(detok.token_text(t) for t, _ in e.top)
        assert e.top_bytes == tuple(detok.token_bytes(t) for t, _ in e.top)


def test_the_engine_seed_makes_unseeded_requests_reproducible(
    tiny_model_factory: Callable[..., Path],
) -> None:
    model = tiny_model_factory("llama3")
    unseeded = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)

    def sample(**config: object) -> list[list[int]]:
        outputs = LLM(model, compile="off", **config).generate(["Hello world", "What is"], unseeded)  # type: ignore[arg-type]
        return [o.outputs[0].token_ids for o in outputs]

    first = sample(seed=7)
    assert sample(seed=7) == first  # a fresh engine, the same seed: the same draws
    assert sample(seed=8) != first
    assert first[0] != first[1]  # each request still draws its own stream
