"""The sampler from Python: every processor and filter against plain numpy, a chi-square test of
the draws against `filtered_probs`, logprobs against log_softmax, and the input contract."""

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from ferrollm import SamplingParams, ValidationError
from ferrollm.testing import Sampler, SampleResult

#: Parameters as users build them: through the validating public constructor.
P = SamplingParams
F32 = npt.NDArray[np.float32]
NEG_INF = np.float32(-np.inf)


def rng_row(vocab: int, seed: int, scale: float = 3.0) -> F32:
    return (np.random.default_rng(seed).standard_normal(vocab) * scale).astype(np.float32)


# --- numpy references --------------------------------------------------------------------------


def ref_no_repeat_ngram(n: int, seq: list[int]) -> set[int]:
    """HF NoRepeatNGramLogitsProcessor over the whole sequence (prompt + output)."""
    if n == 0 or len(seq) + 1 < n:
        return set()
    grams: dict[tuple[int, ...], list[int]] = {}
    for i in range(len(seq) - n + 1):
        grams.setdefault(tuple(seq[i : i + n - 1]), []).append(seq[i + n - 1])
    return set(grams.get(tuple(seq[len(seq) + 1 - n :]), []))


def ref_bans(
    f: dict[str, Any], prompt: list[int], output: list[int], eos: Sequence[int]
) -> set[int]:
    banned: set[int] = set()
    for word in f.get("bad_words", []):
        if word and (len(word) == 1 or output[len(output) - len(word) + 1 :] == word[:-1]):
            banned.add(word[-1])
    if len(output) < f.get("min_tokens", 0):
        banned |= set(eos) | set(f.get("stop_token_ids", []))
    return banned | ref_no_repeat_ngram(f.get("no_repeat_ngram_size", 0), prompt + output)


def ref_process(
    row: F32, f: dict[str, Any], prompt: list[int], output: list[int], eos: Sequence[int] = ()
) -> F32:
    """Steps 1-8 in float32, one numpy expression per rule."""
    x = np.where(np.isnan(row), NEG_INF, row).astype(np.float32)
    for tid, bias in f.get("logit_bias", {}).items():
        x[tid] += np.float32(bias)
    if "embedding_bias" in f:
        x += np.asarray(f["embedding_bias"], dtype=np.float32)
    if "allowed_token_ids" in f:
        keep = np.zeros(len(x), dtype=bool)
        keep[f["allowed_token_ids"]] = True
        x[~keep] = NEG_INF
    x[sorted(ref_bans(f, prompt, output, eos))] = NEG_INF
    rep = np.float32(f.get("repetition_penalty", 1.0))
    if rep != 1.0:
        seen = np.unique(np.asarray(prompt + output, dtype=np.int64))
        x[seen] = np.where(x[seen] > 0, x[seen] / rep, x[seen] * rep)
    counts = np.bincount(np.asarray(output, dtype=np.int64), minlength=len(x)).astype(np.float32)
    hit = counts > 0
    freq, pres = (
        np.float32(f.get("frequency_penalty", 0.0)),
        np.float32(f.get("presence_penalty", 0.0)),
    )
    x[hit] -= freq * counts[hit] + pres
    t = np.float32(f.get("temperature", 1.0))
    return x / t if t > 0 and t != 1 else x


def ranked(probs: npt.NDArray[np.float64]) -> npt.NDArray[np.intp]:
    """Ids with nonzero probability by descending probability, ties by id."""
    ids = np.flatnonzero(probs > 0)
    return ids[np.lexsort((ids, -probs[ids]))]


def ref_filtered(x: F32, f: dict[str, Any]) -> npt.NDArray[np.float64]:
    """Steps 9-12 in float64 with full sorts (HF/vLLM rules, top-k ties by id)."""
    z = x.astype(np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    top_k = f.get("top_k", 0)
    if 0 < top_k < len(x):
        ids = np.flatnonzero(p > 0)
        order = ids[np.lexsort((ids, -z[ids]))]
        p[order[top_k:]] = 0
        p /= p.sum()
    if f.get("top_p", 1.0) < 1.0:
        order = ranked(p)
        before = np.concatenate([[0.0], np.cumsum(p[order])[:-1]])
        p[order[before >= np.float32(f["top_p"])]] = 0
        p /= p.sum()
    if f.get("min_p", 0.0) > 0:
        p[p < np.float32(f["min_p"]) * p.max()] = 0
        p /= p.sum()
    if f.get("typical_p", 1.0) < 1.0:
        live = np.flatnonzero(p > 0)
        logp = np.log(p[live])
        score = np.abs(-logp + (p[live] * logp).sum())
        order = np.lexsort((live, score))
        last = min(
            int((np.cumsum(p[live][order]) < np.float32(f["typical_p"])).sum()), len(live) - 1
        )
        p[live[score > score[order[last]]]] = 0
        p /= p.sum()
    return p


# --- processors and filters ----------------------------------------------------------------------

PROMPT = [int(t) for t in np.random.default_rng(1).integers(0, 48, 30)]
OUTPUT = [int(t) for t in np.random.default_rng(2).integers(0, 48, 20)]

PROCESSOR_CASES: list[dict[str, Any]] = [
    {"logit_bias": {0: 2.5, 7: -1.0, 47: 0.25}},
    {"embedding_bias": [float(v) for v in rng_row(48, 3, 1.0)]},
    {"allowed_token_ids": [1, 9, 33]},
    {"bad_words": [[3], [OUTPUT[-1], 11], [OUTPUT[-2], OUTPUT[-1], 12], [47, 13]]},
    {"min_tokens": 21, "stop_token_ids": [4, 8]},
    {"min_tokens": 20, "stop_token_ids": [4, 8]},
    {"no_repeat_ngram_size": 1},
    {"no_repeat_ngram_size": 2},
    {"no_repeat_ngram_size": 3},
    {"repetition_penalty": 1.3},
    {"repetition_penalty": 0.7},
    {"presence_penalty": 0.5},
    {"frequency_penalty": -0.75, "presence_penalty": 0.25},
    {"temperature": 0.6},
    {
        "logit_bias": {2: 1.0},
        "allowed_token_ids": list(range(40)),
        "bad_words": [[6]],
        "repetition_penalty": 1.2,
        "presence_penalty": 0.3,
        "frequency_penalty": 0.2,
        "no_repeat_ngram_size": 2,
        "temperature": 1.7,
    },
]


@pytest.mark.parametrize("fields", PROCESSOR_CASES)
def test_processors_match_numpy(fields: dict[str, Any]) -> None:
    row = rng_row(48, 10 + len(str(fields)), 4.0)
    row[17] = np.nan
    got = Sampler.process_logits(row, P(**fields), PROMPT, OUTPUT, eos_token_ids=[0, 2])
    want = ref_process(row, fields, PROMPT, OUTPUT, eos=[0, 2])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    assert got.dtype == np.float32 and not np.isnan(got).any()


FILTER_CASES: list[dict[str, Any]] = [
    {},
    {"top_k": 1},
    {"top_k": 5},
    {"top_p": 0.5},
    {"top_p": 0.95},
    {"min_p": 0.05},
    {"min_p": 0.5},
    {"typical_p": 0.3},
    {"typical_p": 0.9},
    {"top_k": 30, "top_p": 0.8, "min_p": 0.02, "typical_p": 0.9},
    {"top_p": 0.9, "min_p": 0.1},
]


@pytest.mark.parametrize("fields", FILTER_CASES)
@pytest.mark.parametrize(("vocab", "scale"), [(48, 3.0), (5000, 2.0), (5000, 20.0)])
def test_filters_match_numpy(fields: dict[str, Any], vocab: int, scale: float) -> None:
    x = rng_row(vocab, vocab + len(FILTER_CASES), scale)
    x[3] = NEG_INF
    got = Sampler.filtered_probs(x, P(**fields))
    want = ref_filtered(x, fields)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)
    # Same support, except that weights below e^-87 of the top one are exactly 0 in the sampler.
    assert np.all(got[want == 0] == 0) and np.all(got[want > 1e-30] > 0)


def test_top_k_at_vocab_and_top_p_one_are_no_ops() -> None:
    x = rng_row(48, 5)
    plain = Sampler.filtered_probs(x, P())
    np.testing.assert_array_equal(Sampler.filtered_probs(x, P(top_k=48)), plain)
    np.testing.assert_array_equal(Sampler.filtered_probs(x, P(top_k=10**6, top_p=1.0)), plain)


# --- draws ---------------------------------------------------------------------------------------


def draw_many(row: F32, params: SamplingParams, n: int, output: list[int]) -> SampleResult:
    """`n` draws from one row, each with its own seed."""
    return Sampler().sample(
        row[None, :], np.zeros(n, dtype=np.int64), [params] * n, [[]] * n, [output] * n,
        np.arange(n, dtype=np.uint64) + 12345,
    )  # fmt: skip


def chi2_critical(df: int, z: float = 4.753) -> float:
    """Wilson-Hilferty upper quantile of chi-square; z = 4.753 is the normal 1 - 1e-6 quantile."""
    a = 2.0 / (9.0 * df)
    return float(df * (1.0 - a + z * np.sqrt(a)) ** 3)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"temperature": 0.7, "top_k": 8},
        {"top_p": 0.8},
        {"min_p": 0.1, "temperature": 1.5},
        {"typical_p": 0.7},
        {"top_k": 20, "top_p": 0.9, "repetition_penalty": 1.3, "frequency_penalty": 0.4},
    ],
)
def test_draw_frequencies_fit_filtered_probs(fields: dict[str, Any]) -> None:
    n, row, output = 20_000, rng_row(40, 99, 1.5), [1, 2, 2, 3]
    params = P(**fields)
    probs = Sampler.filtered_probs(Sampler.process_logits(row, params, [], output), params)
    counts = np.bincount(draw_many(row, params, n, output).token_ids, minlength=40)
    assert counts[probs == 0].sum() == 0, "a removed token was drawn"
    expected = probs.astype(np.float64) * n
    small = (expected > 0) & (expected < 5)
    obs = np.append(counts[expected >= 5], counts[small].sum())
    exp = np.append(expected[expected >= 5], expected[small].sum())
    keep = exp > 0
    stat = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    df = int(keep.sum()) - 1
    assert df >= 1
    assert stat < chi2_critical(df), f"chi2 {stat:.1f} with {df} degrees of freedom"


def test_greedy_is_argmax_and_draws_are_seeded() -> None:
    logits = np.stack([rng_row(300, s) for s in range(3)])
    logits[1, [5, 9]] = logits[1].max() + 1
    greedy = P(temperature=0.0)
    res = Sampler().sample(logits, [0, 1, 2], [greedy] * 3, [[]] * 3, [[]] * 3, [1, 2, 3])
    np.testing.assert_array_equal(res.token_ids, [logits[0].argmax(), 5, logits[2].argmax()])
    params = P(top_p=0.9, temperature=1.2)
    args = ([0, 1, 2], [params] * 3, [[1]] * 3, [[2, 3]] * 3, [7, 8, 9])
    a = Sampler().sample(logits, *args).token_ids
    b = Sampler().sample(logits[::-1].copy(), [2, 1, 0], *args[1:]).token_ids
    alone = [
        Sampler().sample(logits[i : i + 1], [0], [params], [[1]], [[2, 3]], [7 + i])
        for i in range(3)
    ]
    np.testing.assert_array_equal(a, [r.token_ids[0] for r in alone])
    np.testing.assert_array_equal(a, b)
    assert b.dtype == np.uint32 and len(a) == 3


# --- logprobs ------------------------------------------------------------------------------------


def log_softmax(x: F32) -> npt.NDArray[np.float64]:
    z = x.astype(np.float64)
    return z - z.max() - np.log(np.exp(z - z.max()).sum())


def test_logprobs_raw_and_processed() -> None:
    row = rng_row(1000, 4, 5.0)
    params = P(top_k=3, temperature=0.5, repetition_penalty=1.3, logprobs=5)
    args = ([0], [params], [[]], [[1, 2]], [11])
    raw = Sampler("raw").sample(row[None, :], *args)
    want = log_softmax(row)
    top = np.argsort(-want, kind="stable")[:5]
    np.testing.assert_array_equal(raw.top_token_ids[0], top)
    np.testing.assert_allclose(raw.top_logprobs[0], want[top], atol=1e-5, rtol=0)
    np.testing.assert_allclose(raw.logprobs, want[raw.token_ids], atol=1e-5, rtol=0)

    processed = Sampler("processed").sample(row[None, :], *args)
    probs = ref_filtered(
        ref_process(row, {"temperature": 0.5, "repetition_penalty": 1.3}, [], [1, 2]), {"top_k": 3}
    )
    kept = ranked(probs)
    assert len(kept) == 3
    np.testing.assert_array_equal(processed.top_token_ids[0, :3], kept)
    np.testing.assert_allclose(
        processed.top_logprobs[0, :3], np.log(probs[kept]), atol=1e-5, rtol=0
    )
    assert np.all(processed.top_logprobs[0, 3:] == -np.inf)
    np.testing.assert_allclose(processed.logprobs, np.log(probs[processed.token_ids]), atol=1e-5)


def test_result_columns_pad_samples_without_logprobs() -> None:
    row = rng_row(50, 6)[None, :]
    res = Sampler().sample(row, [0, 0], [P(logprobs=2), P()], [[], []], [[], []], [1, 2])
    assert res.top_token_ids.shape == (2, 2) and res.top_token_ids.dtype == np.int32
    assert list(res.top_token_ids[1]) == [-1, -1] and np.all(res.top_logprobs[1] == -np.inf)
    assert np.isnan(res.logprobs[1]) and not np.isnan(res.logprobs[0])
    assert len(res) == 2
    none = Sampler().sample(row, [0], [P()], [[]], [[]], [1])
    assert none.top_logprobs.shape == (1, 0)


# --- input contract ------------------------------------------------------------------------------


def test_logits_are_read_in_place_from_contiguous_views() -> None:
    big = np.stack([rng_row(64, s) for s in range(4)])
    view = big[1:3]  # C-contiguous with an offset into `big`
    view.flags.writeable = False
    greedy = P(temperature=0.0)
    res = Sampler().sample(view, [1, 0], [greedy] * 2, [[]] * 2, [[]] * 2, [0, 0])
    np.testing.assert_array_equal(res.token_ids, [big[2].argmax(), big[1].argmax()])
    ids = np.array([5, 6], dtype=np.uint32)
    res = Sampler().sample(view, [0], [P(temperature=0.0)], [ids], [ids[::-1]], np.array([0]))
    assert res.token_ids[0] == big[1].argmax()


@pytest.mark.parametrize(
    "logits",
    [
        np.zeros((2, 8), dtype=np.float64),
        np.zeros((2, 16), dtype=np.float32)[:, ::2],
        np.zeros((8, 2), dtype=np.float32).T,
        np.zeros(8, dtype=np.float32),
        [[0.0] * 8] * 2,
    ],
)
def test_other_logits_are_rejected_naming_the_fix(logits: Any) -> None:
    with pytest.raises(ValidationError) as info:
        Sampler().sample(logits, [0], [P()], [[]], [[]], [0])
    assert info.value.param == "logits"


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"rows": [5]}, "logits"),
        ({"seeds": [1, 2]}, "seeds"),
        ({"prompts": []}, "prompts"),
        ({"outputs": [[-1]]}, "outputs[0]"),
        ({"sample_indices": [0, 1]}, "sample_indices"),
        ({"params": [P(embedding_bias=[0.0])]}, "embedding_bias"),
        ({"params": [P(allowed_token_ids=[1], min_tokens=1)], "eos_token_ids": [1]}, "logits[0]"),
    ],
)
def test_bad_arguments_name_the_field(change: dict[str, Any], param: str) -> None:
    args: dict[str, Any] = {
        "logits": np.zeros((1, 8), dtype=np.float32),
        "rows": [0],
        "params": [P()],
        "prompts": [[]],
        "outputs": [[]],
        "seeds": [0],
    }
    args.update(change)
    with pytest.raises(ValidationError) as info:
        Sampler().sample(**args)
    assert info.value.param == param


def test_more_than_20_logprobs_are_refused_by_the_params() -> None:
    with pytest.raises(ValidationError) as info:
        SamplingParams(logprobs=21)
    assert info.value.param == "logprobs"


def test_sampler_mode_is_checked() -> None:
    assert Sampler().logprobs_mode == "raw" and Sampler("processed").logprobs_mode == "processed"
    assert Sampler().num_threads >= 1
    with pytest.raises(ValidationError) as info:
        Sampler("nope")
    assert info.value.param == "logprobs_mode"
