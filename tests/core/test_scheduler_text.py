"""The scheduler's whole step in Rust: sample from logits, append, detokenize, match stops.

A byte-level BPE tokenizer is trained here with the `tokenizers` package (no downloads); the
scheduler gets it as a `Detokenizer` and must give, per request, text deltas whose concatenation
equals the non-streamed result, cut at stop strings.
"""

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ferrollm import (
    FINISH_REASON_NAMES,
    Detokenizer,
    NewRequest,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    StepOutput,
    ValidationError,
)
from ferrollm.testing import truncate_at_stop

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello world! Hello, stop here.",
    "Paris is the capital of France. 北京是中国的首都。 Emoji: 🦀🚀 naïve café.",
    "def main():\n    return 42\n\nUser: hi\nAssistant: hello",
]
EOS = "<|endoftext|>"


@pytest.fixture(scope="module")
def detok(tmp_path_factory: pytest.TempPathFactory) -> Detokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    path: Path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return Detokenizer.from_file(path)


def eos_id(detok: Detokenizer) -> int:
    ids = detok.encode(EOS, add_special_tokens=False)
    assert len(ids) == 1
    return ids[0]


def scheduler(detok: Detokenizer, **kwargs: Any) -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            num_blocks=256, block_size=4, max_model_len=512, eos_token_ids=[eos_id(detok)], **kwargs
        ),
        detok,
    )


def run_forced(s: Scheduler, outputs: dict[int, list[int]]) -> dict[int, list[StepOutput]]:
    """Plays a model that emits `outputs[rid]` token by token; collects every step's output."""
    seen: dict[int, list[StepOutput]] = {rid: [] for rid in outputs}
    pos = dict.fromkeys(outputs, 0)
    while s.has_unfinished_requests():
        plan = s.schedule()
        rows = plan.sample_rows.tolist()
        rids = [int(plan.req_ids[r]) for r in rows]
        tokens = []
        for rid in rids:
            tokens.append(outputs[rid][pos[rid]])
            pos[rid] += 1
        out = s.update(plan, np.array(tokens, dtype=np.int64))
        for rid in set(rids):
            seen[rid].append(out)
    return seen


def deltas(outs: list[StepOutput], rid: int) -> tuple[str, list[str], list[str | int]]:
    """The request's concatenated text, its finish reasons and stop indices."""
    text, finishes, stops = "", [], []
    for out in outs:
        offsets = out.text_offsets.tolist()
        for i, r in enumerate(out.req_ids.tolist()):
            if r != rid:
                continue
            text += out.text[offsets[i] : offsets[i + 1]]
            if out.finish_reasons[i]:
                finishes.append(FINISH_REASON_NAMES[out.finish_reasons[i]])
                stops.append(int(out.stop_str_indices[i]))
    return text, finishes, stops


@pytest.mark.parametrize(
    ("stop", "include"),
    [
        ([], False),
        (["stop here"], False),
        (["stop here"], True),
        (["Hello", "zzz"], False),
        (["首都"], False),
        (["🚀"], True),
        (["never matches"], False),
    ],
)
def test_text_deltas_equal_the_non_streamed_result(
    detok: Detokenizer, stop: list[str], include: bool
) -> None:
    s = scheduler(detok)
    texts = {1: CORPUS[0], 2: CORPUS[1], 3: CORPUS[2]}
    outputs = {rid: detok.encode(t, add_special_tokens=False) for rid, t in texts.items()}
    for rid, ids in outputs.items():
        params = SamplingParams(max_tokens=len(ids), stop=stop, include_stop_str_in_output=include)
        s.add_request(NewRequest(rid, [5, 6, 7], params))
    seen = run_forced(s, outputs)
    for rid, full in texts.items():
        text, finishes, stop_indices = deltas(seen[rid], rid)
        expected, matched = truncate_at_stop(full, stop, include)
        assert text == expected
        assert finishes == ["stop" if matched is not None else "length"]
        assert stop_indices == [stop.index(matched) if matched is not None else -1]
    s.check_invariants()


def test_eos_and_stop_token_text_is_dropped_unless_included(detok: Detokenizer) -> None:
    hello = detok.encode("Hello world", add_special_tokens=False)
    for include, stop_ids in [(False, []), (True, [hello[-1]])]:
        s = scheduler(detok)
        params = SamplingParams(
            max_tokens=50, stop_token_ids=stop_ids, include_stop_str_in_output=include
        )
        s.add_request(NewRequest(1, [5], params))
        out_ids = hello if stop_ids else [*hello, eos_id(detok)]
        text, finishes, _ = deltas(run_forced(s, {1: out_ids})[1], 1)
        assert finishes == ["stop"]
        assert text == ("Hello world" if include else detok.decode(hello))
        if not include:
            assert "<|endoftext|>" not in text


def test_stop_strings_need_a_tokenizer() -> None:
    s = Scheduler(SchedulerConfig(num_blocks=16, block_size=4, max_model_len=32))
    with pytest.raises(ValidationError) as e:
        s.add_request(NewRequest(1, [1, 2], SamplingParams(stop=["x"])))
    assert e.value.param == "stop"


def logits_for(plan_samples: int, vocab: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((plan_samples, vocab), dtype=np.float32) * 3


def test_greedy_from_logits_is_argmax_and_logprobs_are_raw(detok: Detokenizer) -> None:
    vocab = detok.vocab_size
    s = scheduler(detok)
    s.add_request(
        NewRequest(1, [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=4, logprobs=3))
    )
    s.add_request(
        NewRequest(2, [4, 5], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    )
    step = 0
    while s.has_unfinished_requests():
        plan = s.schedule()
        logits = logits_for(plan.num_samples, vocab, step)
        step += 1
        out = s.update_with_logits(plan, logits)
        np.testing.assert_array_equal(out.token_ids, logits.argmax(axis=1))
        for i, rid in enumerate(out.req_ids.tolist()):
            if rid == 1:
                row = logits[i].astype(np.float64)
                logp = row - np.log(np.exp(row - row.max()).sum()) - row.max()
                assert out.logprobs[i] == pytest.approx(logp[out.token_ids[i]], abs=1e-5)
                top = np.argsort(-logp, kind="stable")[:3]
                np.testing.assert_array_equal(out.top_token_ids[i], top)
                np.testing.assert_allclose(out.top_logprobs[i], logp[top], atol=1e-5)
            else:
                assert np.isnan(out.logprobs[i])
                assert (out.top_token_ids[i] == -1).all()


def sampled_tokens(detok: Detokenizer, seeded_rid: int, others: int) -> list[int]:
    """Tokens of a seeded request drawn alongside `others` unseeded requests."""
    vocab = detok.vocab_size
    s = scheduler(detok)
    for rid in range(others):
        s.add_request(
            NewRequest(100 + rid, [9] * (rid + 1), SamplingParams(max_tokens=8, ignore_eos=True))
        )
    params = SamplingParams(seed=1234, max_tokens=8, top_p=0.9, ignore_eos=True)
    s.add_request(NewRequest(seeded_rid, [1, 2, 3], params))
    got: list[int] = []
    # The logits of the seeded request depend only on its own position, so any difference in
    # its tokens can only come from the batch around it.
    while s.has_unfinished_requests():
        plan = s.schedule()
        rows = plan.sample_rows.tolist()
        logits = np.stack(
            [
                logits_for(1, vocab, 77 + len(got))[0]
                if int(plan.req_ids[r]) == seeded_rid
                else logits_for(1, vocab, 1000 + k)[0]
                for k, r in enumerate(rows)
            ]
        )
        out = s.update_with_logits(plan, logits)
        got += [
            t
            for t, r in zip(out.token_ids.tolist(), out.req_ids.tolist(), strict=True)
            if r == seeded_rid
        ]
    return got


def test_seeded_request_gets_the_same_tokens_in_any_batch(detok: Detokenizer) -> None:
    alone = sampled_tokens(detok, seeded_rid=1, others=0)
    assert len(alone) == 8
    assert sampled_tokens(detok, seeded_rid=1, others=5) == alone
    # The request id does not enter a seeded draw: same seed, same prompt, same tokens.
    assert sampled_tokens(detok, seeded_rid=7, others=3) == alone


def test_update_rejects_logits_of_the_wrong_shape(detok: Detokenizer) -> None:
    s = scheduler(detok)
    s.add_request(NewRequest(1, [1, 2], SamplingParams(max_tokens=2)))
    plan = s.schedule()
    with pytest.raises(ValidationError) as e:
        s.update_with_logits(
            plan, np.zeros((plan.num_samples + 1, detok.vocab_size), dtype=np.float32)
        )
    assert e.value.param == "logits"
    # The failed call changed nothing: the same plan still applies.
    out = s.update_with_logits(
        plan, np.zeros((plan.num_samples, detok.vocab_size), dtype=np.float32)
    )
    assert len(out) == 1
