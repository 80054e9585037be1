"""One request, one shape: the scheduler's config object, admission against the model's
vocabulary, requests that fail alone inside a step, and the stop reason columns."""

from typing import Any

import numpy as np
import pytest

from ferrollm import (
    FINISH_REASON_NAMES,
    NewRequest,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    ValidationError,
)

VOCAB = 16


def scheduler(**kwargs: Any) -> Scheduler:
    fields: dict[str, Any] = {"num_blocks": 64, "block_size": 4, "max_model_len": 64}
    return Scheduler(SchedulerConfig(**(fields | kwargs)))


def test_config_is_frozen_keyword_only_and_reads_back() -> None:
    config = SchedulerConfig(num_blocks=64, max_model_len=64, vocab_size=VOCAB, seed=3)
    assert (config.num_blocks, config.block_size, config.max_num_seqs) == (64, 16, 256)
    assert (config.max_num_batched_tokens, config.max_num_waiting) == (8192, 4096)
    assert (config.enable_prefix_caching, config.priority_aging_s) == (True, 10.0)
    assert (config.eos_token_ids, config.logprobs_mode) == ([], "raw")
    assert (config.vocab_size, config.seed) == (VOCAB, 3)
    assert "vocab_size=16" in repr(config)
    assert Scheduler(config).config == config
    with pytest.raises(AttributeError):
        config.num_blocks = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        SchedulerConfig(64)  # type: ignore[misc]
    for field, value in [("logprobs_mode", "nope"), ("eos_token_ids", [-1])]:
        with pytest.raises(ValidationError) as info:
            SchedulerConfig(num_blocks=64, max_model_len=64, **{field: value})
        assert info.value.param == field


@pytest.mark.parametrize(
    ("prompt", "params", "param"),
    [
        ([1, VOCAB], {}, "prompt_token_ids"),
        ([1], {"embedding_bias": [0.0] * (VOCAB + 1)}, "embedding_bias"),
        ([1], {"logit_bias": {VOCAB: 1.0}}, "logit_bias"),
        ([1], {"allowed_token_ids": [1, VOCAB]}, "allowed_token_ids"),
        ([1], {"bad_words": [[2, VOCAB]]}, "bad_words"),
        ([1], {"stop_token_ids": [VOCAB + 5]}, "stop_token_ids"),
        ([1], {"stop_token_sequences": [[VOCAB]]}, "stop_token_sequences"),
    ],
)
def test_admission_refuses_what_does_not_fit_the_vocabulary(
    prompt: list[int], params: dict[str, Any], param: str
) -> None:
    s = scheduler(vocab_size=VOCAB)
    with pytest.raises(ValidationError) as info:
        s.add_request(NewRequest(1, prompt, SamplingParams(**params)))
    assert info.value.param == param and f"`{param}`" in str(info.value)
    assert not s.has_unfinished_requests()
    # With the vocabulary unknown the scheduler cannot tell, and accepts it.
    scheduler().add_request(NewRequest(1, prompt, SamplingParams(**params)))


def test_a_row_without_a_finite_logit_fails_its_request_alone() -> None:
    s = scheduler(eos_token_ids=[0])
    greedy = {"temperature": 0, "max_tokens": 4}
    s.add_request(NewRequest(1, [1, 2, 3], SamplingParams(**greedy)))
    s.add_request(NewRequest(2, [1, 2, 3, 4, 5], SamplingParams(**greedy, allowed_token_ids=[3])))
    s.add_request(NewRequest(3, [4, 5], SamplingParams(**greedy)))
    plan = s.schedule()
    logits = np.zeros((3, VOCAB), dtype=np.float32)
    logits[:, 5] = 1.0
    logits[1, 3] = -np.inf  # request 2's only allowed token
    out = s.update_with_logits(plan, logits)
    assert out.failed_req_ids.tolist() == [2]
    assert len(out.failed_messages) == 1 and "no finite value" in out.failed_messages[0]
    [error] = out.failed_errors
    assert isinstance(error, ValidationError) and error.code == "no_finite_logit"
    assert str(error) == out.failed_messages[0]
    assert out.req_ids.tolist() == [1, 3] and out.token_ids.tolist() == [5, 5]
    assert out.finished_req_ids.tolist() == []
    assert FINISH_REASON_NAMES[5] == "error"
    s.check_invariants()
    assert sorted(seq["request_id"] for seq in s.sequences()) == [1, 3]
    assert s.stats()["num_used_blocks"] == 2, "request 2's blocks went back to the pool"
    nxt = s.schedule()
    assert nxt.req_ids.tolist() == [1, 3]
    assert s.update(nxt, [6, 6]).failed_req_ids.tolist() == []


def test_update_takes_token_ids_and_update_with_logits_takes_float32_logits() -> None:
    s = scheduler()
    s.add_request(NewRequest(1, [1, 2], SamplingParams(max_tokens=3)))
    plan = s.schedule()
    with pytest.raises(ValidationError) as info:
        s.update_with_logits(plan, [7])  # type: ignore[arg-type]
    assert info.value.param == "logits"
    with pytest.raises(ValidationError) as info:
        s.update(plan, np.zeros((1, VOCAB), dtype=np.float32))
    assert info.value.param == "token_ids"
    assert s.update(plan, np.array([7], dtype=np.uint32)).token_ids.tolist() == [7]


@pytest.mark.parametrize(
    ("params", "token", "stop_token_id"),
    [
        ({"stop_token_ids": [9]}, 9, 9),
        ({"stop_token_ids": [9]}, 0, -1),  # EOS is no stop reason
        ({"stop_token_ids": [0, 9]}, 0, -1),  # ... even when it is also a stop token id
        ({"stop_token_ids": [0], "ignore_eos": True}, 0, 0),
        ({"stop_token_ids": [9]}, 4, -1),
    ],
)
def test_stop_token_id_column(params: dict[str, Any], token: int, stop_token_id: int) -> None:
    s = scheduler(eos_token_ids=[0])
    s.add_request(NewRequest(1, [1, 2], SamplingParams(max_tokens=5, **params)))
    out = s.update(s.schedule(), [token])
    assert out.stop_token_ids.dtype == np.int64
    assert out.stop_token_ids.tolist() == [stop_token_id]
    assert out.stop_str_indices.tolist() == [-1]


def sampled_run(seed: int | None) -> list[int]:
    s = scheduler(seed=seed)
    for rid in range(3):
        s.add_request(NewRequest(rid, [1, 2], SamplingParams(max_tokens=4, ignore_eos=True)))
    tokens: list[int] = []
    while s.has_unfinished_requests():
        plan = s.schedule()
        out = s.update_with_logits(plan, np.zeros((plan.num_samples, 1000), dtype=np.float32))
        tokens += out.token_ids.tolist()
    return tokens


def test_a_config_seed_makes_a_run_of_unseeded_requests_reproducible() -> None:
    assert sampled_run(5) == sampled_run(5)
    assert sampled_run(5) != sampled_run(6)
    assert sampled_run(None) != sampled_run(None)


def test_the_encoder_budget_defaults_to_the_token_budget_or_4096() -> None:
    small = SchedulerConfig(num_blocks=64, max_model_len=64, max_num_batched_tokens=64)
    assert small.max_num_encoder_tokens == 4096
    big = SchedulerConfig(num_blocks=64, max_model_len=64, max_num_batched_tokens=10_000)
    assert big.max_num_encoder_tokens == 10_000
    assert "max_num_encoder_tokens=10000" in repr(big)
    with pytest.raises(ValidationError) as info:
        SchedulerConfig(num_blocks=64, max_model_len=64, max_num_encoder_tokens=0)
    assert info.value.param == "max_num_encoder_tokens"


@pytest.mark.parametrize(
    "media",
    [
        [(2, 0, "image:a")],  # empty
        [(0, 4, "image:a"), (3, 2, "image:b")],  # overlapping
        [(4, 2, "image:a"), (0, 2, "image:b")],  # out of order
        [(8, 3, "image:a")],  # past the prompt's 10 tokens
    ],
)
def test_media_spans_are_checked_when_added(media: list[tuple[int, int, str]]) -> None:
    s = scheduler()
    with pytest.raises(ValidationError) as info:
        s.add_request(NewRequest(1, list(range(1, 11)), media=media))
    assert info.value.param == "media"
    assert not s.has_unfinished_requests()


def test_an_image_over_the_encoder_budget_waits_for_the_next_step() -> None:
    s = scheduler(max_num_encoder_tokens=10)
    image = [100] * 8
    s.add_request(NewRequest(1, [1, 2, *image], media=[(2, 8, "image:a")], arrival_time=0.0))
    s.add_request(NewRequest(2, [1, 2, *image], media=[(2, 8, "image:b")], arrival_time=1.0))
    plan = s.schedule(now=1.0)
    assert np.diff(plan.cu_seqlens_q).tolist() == [10, 2], "request 2 ends before its image"
    assert plan.num_encoder_tokens == 8
    s.update(plan, [3] * plan.num_samples)
    plan = s.schedule(now=1.0)
    assert np.diff(plan.cu_seqlens_q).tolist() == [1, 8]
    assert plan.num_encoder_tokens == 8


def test_text_before_an_image_is_shared_whatever_the_image() -> None:
    s = scheduler()
    prompt = [*range(1, 9), *[100] * 8, 50, 51]
    for i, digest in enumerate(["image:a", "image:b", "image:a"]):
        s.add_request(NewRequest(i, prompt, media=[(8, 8, digest)], arrival_time=float(i)))
        plan = s.schedule(now=float(i))
        s.update(plan, [3] * plan.num_samples)
    hits = s.stats()["num_prefix_hit_blocks"]
    assert hits == 2 + 4, "image b: the two text blocks; image a again: all four full blocks"
