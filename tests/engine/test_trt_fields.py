"""Every field of the TRT-style request acts (docs/api/trt.md#tensors-in, docs/api/trt.md#sampling):
a request with it and one without differ as the field says. Greedy unless the test samples; a tiny
random model."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from trt_helpers import (
    ENGINE_OPTIONS,
    PROMPT,
    has_repeated_ngram,
    run,
    sampling,
    tokens,
)

from ferrollm.trt import Executor


@pytest.fixture(scope="module")
def executor(tiny_model_factory: Callable[..., Path]) -> Iterator[Executor]:
    executor = Executor(tiny_model_factory("llama3"), **ENGINE_OPTIONS)
    yield executor
    executor.shutdown()


@pytest.fixture(scope="module")
def greedy(executor: Executor) -> list[int]:
    return tokens(executor, n=40)


def test_absent_top_k_and_top_p_are_greedy_whatever_the_temperature(
    executor: Executor, greedy: list[int]
) -> None:
    # TRT's 0 / 0.0 mean off, which together is greedy (docs/api/trt.md#sampling).
    assert tokens(executor, n=40, temperature=5.0, random_seed=3) == greedy
    assert tokens(executor, n=40, runtime_top_k=0, runtime_top_p=0.0, temperature=5.0) == greedy


def test_temperature(executor: Executor, greedy: list[int]) -> None:
    cold = tokens(executor, n=40, **sampling(temperature=1e-4, random_seed=1))
    hot = tokens(executor, n=40, **sampling(temperature=3.0, random_seed=1))
    assert cold == greedy
    assert hot != greedy


def test_runtime_top_k(executor: Executor, greedy: list[int]) -> None:
    # Top-k 1 samples only the argmax; top-k 0 (off) with top-p 1.0 samples everything.
    assert tokens(executor, n=40, runtime_top_k=1, temperature=3.0, random_seed=1) == greedy
    assert tokens(executor, n=40, **sampling(temperature=3.0, random_seed=1)) != greedy


def test_runtime_top_p(executor: Executor, greedy: list[int]) -> None:
    tiny_p = {"runtime_top_p": 1e-6, "temperature": 3.0, "random_seed": 1}
    assert tokens(executor, n=40, **tiny_p) == greedy
    assert tokens(executor, n=40, **{**tiny_p, "runtime_top_p": 1.0}) != greedy


def test_random_seed(executor: Executor) -> None:
    a = tokens(executor, n=20, **sampling(random_seed=11))
    assert tokens(executor, n=20, **sampling(random_seed=11)) == a
    assert tokens(executor, n=20, **sampling(random_seed=12)) != a


def test_repetition_penalty(executor: Executor, greedy: list[int]) -> None:
    assert has_repeated_ngram(greedy, 1)
    penalised = tokens(executor, n=40, repetition_penalty=1e4)
    assert penalised != greedy
    assert not set(penalised) & set(PROMPT), "the penalty counts the prompt too"


@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty"])
def test_presence_and_frequency_penalties(
    executor: Executor, greedy: list[int], field: str
) -> None:
    penalised = tokens(executor, n=40, **{field: 1e3})
    assert len(set(penalised)) == len(penalised), "no output token twice"
    first_repeat = next(i for i, t in enumerate(greedy) if t in greedy[:i])
    assert penalised[:first_repeat] == greedy[:first_repeat], "nothing changes before it"


def test_no_repeat_ngram_size(executor: Executor, greedy: list[int]) -> None:
    assert has_repeated_ngram(greedy, 2)
    out = tokens(executor, n=40, no_repeat_ngram_size=2)
    assert not has_repeated_ngram(PROMPT + out, 2)


def test_end_id_ends_the_output_and_minus_one_never_does(
    executor: Executor, greedy: list[int]
) -> None:
    end = greedy[2]
    out = run(executor, n=40, end_id=end)
    assert out.sequence_length is not None and out.output_ids is not None
    assert out.output_ids[0].tolist() == greedy[:3], "ends with (and keeps) end_id"
    assert tokens(executor, n=40, end_id=-1) == greedy


def test_min_length_holds_end_id_back(executor: Executor, greedy: list[int]) -> None:
    end = greedy[0]
    assert tokens(executor, n=40, end_id=end) == [end]
    held = tokens(executor, n=40, end_id=end, min_length=5)
    assert len(held) > 5 and end not in held[:5]


def test_embedding_bias(executor: Executor) -> None:
    bias = np.zeros((1, executor.limits.vocab_size), dtype=np.float32)
    bias[0, 42] = 1e3
    assert tokens(executor, n=6, embedding_bias=bias) == [42] * 6
    bias[0, 42] = 0.0
    assert tokens(executor, n=6, embedding_bias=bias) == tokens(executor, n=6)


def test_bad_words_list_single_and_multi_token(executor: Executor, greedy: list[int]) -> None:
    first = tokens(executor, n=6, bad_words_list=[[greedy[0]], [1]])
    assert first[0] != greedy[0]
    # The word [greedy[1], greedy[2]]: its last token is banned after its first.
    pair = [[greedy[1], greedy[2]], [2, -1]]
    out = tokens(executor, n=12, bad_words_list=pair)
    assert out[:2] == greedy[:2] and out[2] != greedy[2]


def test_stop_words_list_plain_and_batched(executor: Executor, greedy: list[int]) -> None:
    word = [greedy[3], greedy[4]]
    assert tokens(executor, n=30, stop_words_list=[word, [2, -1]]) == greedy[:5]
    batched = np.array([[[999 % 320, 0], [1, -1]], [word, [2, -1]]])
    assert tokens(executor, n=30, stop_words_list=batched) == greedy[:5]


def test_beam_width_len_penalty_early_stopping_and_pad_id(executor: Executor) -> None:
    beams = {"beam_width": 4, "end_id": 200, "len_penalty": 1.0}
    prompt, n = [40, 41, 42, 43], 16
    eager = run(executor, prompt, n, early_stopping=1, **beams)
    patient = run(executor, prompt, n, early_stopping=0, **beams)
    for out in (eager, patient):
        assert out.output_ids is not None and out.output_ids.shape[0] == 4
    assert eager.output_ids is not None and patient.sequence_length is not None
    assert eager.output_ids.tolist() != patient.output_ids.tolist()  # type: ignore[union-attr]
    assert max(patient.sequence_length) == n, "early_stopping 0 searches on"
    # Early-ended beams are padded with end_id, or pad_id when given.
    padded = run(executor, prompt, n, early_stopping=1, pad_id=7, **beams)
    assert padded.output_ids is not None and padded.sequence_length is not None
    for b, length in enumerate(padded.sequence_length.tolist()):
        assert set(padded.output_ids[b, length:].tolist()) <= {7}
        assert set(eager.output_ids[b, length:].tolist()) <= {200}
    assert min(padded.sequence_length) < n, "a beam ended early"
    # The length penalty changes which hypotheses win.
    short = run(executor, [5, 6, 7, 8, 9], 12, beam_width=3, end_id=200, len_penalty=0.0)
    long = run(executor, [5, 6, 7, 8, 9], 12, beam_width=3, end_id=200, len_penalty=3.0)
    assert short.sequence_length is not None and long.sequence_length is not None
    assert sorted(short.sequence_length.tolist()) < sorted(long.sequence_length.tolist())


def test_return_log_probs(executor: Executor) -> None:
    plain = run(executor, n=5)
    assert "output_log_probs" not in plain.tensors and "cum_log_probs" not in plain.tensors
    out = run(executor, n=5, return_log_probs=True)
    logprobs, cum = out.output_log_probs, out.cum_log_probs
    assert logprobs is not None and cum is not None
    assert logprobs.shape == (1, 1, 5) and cum.shape == (1, 1)
    assert logprobs.dtype == np.float32 and (logprobs <= 0).all()
    assert cum[0, 0] == pytest.approx(logprobs.sum(), abs=1e-4)
