"""The Python face of the scheduler: arguments, errors, and the numpy columns of a step."""

from typing import Any

import numpy as np
import pytest

from ferrollm import (
    NewRequest,
    QueueFullError,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    SchedulerError,
    ValidationError,
)


class Err:
    """Expected failure: a ValidationError on `param`."""

    def __init__(self, param: str) -> None:
        self.param = param


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, {"n": 1, "max_tokens": None, "min_tokens": 0, "ignore_eos": False}),
        ({"n": 128, "max_tokens": 1, "min_tokens": 1}, {"n": 128, "max_tokens": 1}),
        ({"stop_token_ids": [5, 6], "ignore_eos": True}, {"stop_token_ids": [5, 6]}),
        ({"n": 0}, Err("n")),
        ({"n": 129}, Err("n")),
        ({"n": -1}, Err("n")),
        ({"n": 2**70}, Err("n")),
        ({"max_tokens": 0}, Err("max_tokens")),
        ({"max_tokens": -5}, Err("max_tokens")),
        ({"min_tokens": -1}, Err("min_tokens")),
        ({"max_tokens": 3, "min_tokens": 4}, Err("min_tokens")),
    ],
)
def test_sampling_params_table(kwargs: dict[str, Any], expected: Any) -> None:
    if isinstance(expected, Err):
        with pytest.raises(ValidationError) as info:
            SamplingParams(**kwargs)
        assert info.value.param == expected.param
        assert info.value.code == "out_of_range"
        assert f"`{expected.param}`" in str(info.value)
    else:
        params = SamplingParams(**kwargs)
        for name, value in expected.items():
            assert getattr(params, name) == value
        assert params == SamplingParams(**kwargs)
        assert "SamplingParams(" in repr(params)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"num_blocks": 1}, "num_blocks"),
        ({"num_blocks": 64, "block_size": 0}, "block_size"),
        ({"num_blocks": 64, "max_num_seqs": 0}, "max_num_seqs"),
        ({"num_blocks": 64, "max_num_batched_tokens": 0}, "max_num_batched_tokens"),
        ({"num_blocks": 64, "max_model_len": 1}, "max_model_len"),
        ({"num_blocks": 64, "max_num_waiting": 0}, "max_num_waiting"),
        ({"num_blocks": 64, "priority_aging_s": -1.0}, "priority_aging_s"),
        ({"num_blocks": 64, "priority_aging_s": float("inf")}, "priority_aging_s"),
        ({"num_blocks": 8, "block_size": 16, "max_model_len": 1024}, "num_blocks"),
    ],
)
def test_config_errors_name_the_field(kwargs: dict[str, Any], param: str) -> None:
    kwargs.setdefault("max_model_len", 64)
    with pytest.raises(ValidationError) as info:
        SchedulerConfig(**kwargs)
    assert info.value.param == param


def small() -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            num_blocks=32, block_size=4, max_num_seqs=4, max_model_len=64, max_num_waiting=2
        )
    )


@pytest.mark.parametrize(
    ("prompt", "kwargs", "param"),
    [
        ([], {}, "prompt_token_ids"),
        ([1] * 64, {}, "prompt_token_ids"),
        ([1, -2], {}, "prompt_token_ids"),
        ([1, 2**32], {}, "prompt_token_ids"),
        (np.zeros((2, 2), dtype=np.int64), {}, "prompt_token_ids"),
        (np.array([1.0, 2.0]), {}, "prompt_token_ids"),
        ("abc", {}, "prompt_token_ids"),
        ([1], {"priority": 0}, "priority"),
        ([1], {"priority": 6}, "priority"),
        ([1], {"priority": -(2**70)}, "priority"),
        ([1], {"deadline": float("nan")}, "deadline"),
        ([1], {"request_id": -1}, "request_id"),
        ([1], {"params": SamplingParams(n=5)}, "n"),
    ],
)
def test_add_request_rejections_name_the_field(
    prompt: Any, kwargs: dict[str, Any], param: str
) -> None:
    s = small()
    request_id = kwargs.pop("request_id", 1)
    with pytest.raises(ValidationError) as info:
        s.add_request(NewRequest(request_id, prompt, **kwargs))
    assert info.value.param == param
    assert f"`{param}`" in str(info.value)
    # The scheduler still serves a normal request after each bad one.
    s.add_request(NewRequest(1, [1, 2, 3], SamplingParams(max_tokens=1)))
    assert s.schedule().num_samples == 1


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint32, np.uint64, np.int16, np.uint8])
def test_prompt_accepts_numpy_integer_arrays_and_lists(dtype: Any) -> None:
    s = small()
    s.add_request(NewRequest(1, np.array([3, 4, 5], dtype=dtype)))
    s.add_request(NewRequest(2, [3, 4, 5]))
    plan = s.schedule()
    assert plan.input_ids.tolist() == [3, 4, 5, 3, 4, 5] or plan.input_ids.tolist()[-1] == 5


def test_prompt_accepts_strided_numpy_views() -> None:
    s = small()
    s.add_request(NewRequest(1, np.arange(1, 11, dtype=np.int64)[::3]))
    s.add_request(NewRequest(2, np.arange(1, 11, dtype=np.uint32)[::3]))
    assert s.schedule().input_ids.tolist() == [1, 4, 7, 10, 1, 4, 7, 10]


def test_queue_full_duplicate_id_stale_plan_and_wrong_sample_count() -> None:
    s = small()
    s.add_request(NewRequest(1, [1, 2]))
    with pytest.raises(ValidationError) as dup:
        s.add_request(NewRequest(1, [1, 2]))
    assert dup.value.param == "request_id"
    s.add_request(NewRequest(2, [1, 2]))
    with pytest.raises(QueueFullError):
        s.add_request(NewRequest(3, [1, 2]))
    plan = s.schedule()
    with pytest.raises(ValidationError) as wrong:
        s.update(plan, [1])
    assert wrong.value.param == "sampled_token_ids"
    s.update(plan, np.array([7, 8], dtype=np.int64))
    with pytest.raises(SchedulerError, match="step"):
        s.update(plan, [7, 8])


def test_plan_columns_shapes_and_dtypes() -> None:
    s = Scheduler(SchedulerConfig(num_blocks=64, block_size=4, max_model_len=64))
    s.add_request(NewRequest(10, list(range(1, 11)), SamplingParams(max_tokens=3)))
    s.add_request(NewRequest(11, [1, 2, 3], SamplingParams(n=2, max_tokens=3)))
    plan = s.schedule(now=100.0)
    assert (plan.num_rows, plan.num_scheduled_tokens, plan.num_samples) == (2, 13, 3)
    assert len(plan) == 2
    assert plan.input_ids.dtype == np.int64 and plan.input_ids.shape == (13,)
    assert plan.positions.tolist() == [*range(10), 0, 1, 2]
    assert plan.cu_seqlens_q.tolist() == [0, 10, 13]
    assert plan.context_lens.tolist() == [10, 3]
    assert plan.block_tables.shape == (2, 3) and plan.block_tables.dtype == np.int32
    assert plan.block_tables[1, 1:].tolist() == [0, 0], "padded with the null block"
    assert plan.req_ids.tolist() == [10, 11]
    assert plan.logits_indices.tolist() == [9, 12, 12]
    assert plan.sample_rows.tolist() == [0, 1, 1]
    assert plan.sample_seq_indices.tolist() == [0, 0, 1]
    assert plan.block_copies.shape == (0, 2)
    slots = plan.block_tables[0][plan.positions[:10] // 4] * 4 + plan.positions[:10] % 4
    assert plan.slot_mapping[:10].tolist() == slots.tolist()
    # The arrays wrap Rust-owned buffers: numpy does not own the data.
    assert not plan.input_ids.flags.owndata
    out = s.update(plan, [5, 6, 7])
    assert out.req_ids.tolist() == [10, 11, 11]
    assert out.seq_indices.tolist() == [0, 0, 1]
    assert out.token_ids.tolist() == [5, 6, 7]
    assert out.finish_reasons.tolist() == [0, 0, 0]
    assert len(out) == 3
    nxt = s.schedule(now=100.0)
    assert nxt.input_ids.tolist() == [5, 6, 7]
    assert nxt.block_copies.shape == (1, 2), "one of the two forks copies the shared partial block"


def test_abort_deadline_and_stats() -> None:
    s = Scheduler(SchedulerConfig(num_blocks=64, block_size=4, max_model_len=64, eos_token_ids=[0]))
    s.add_request(NewRequest(1, [1, 2, 3], arrival_time=0.0))
    s.add_request(NewRequest(2, [1, 2, 3], arrival_time=0.0, deadline=50.0))
    plan = s.schedule(now=1.0)
    s.update(plan, [9, 9])
    assert s.stats()["num_used_blocks"] == 2
    assert s.abort_request(1) and not s.abort_request(1) and not s.abort_request(99)
    plan = s.schedule(now=2.0)
    assert plan.finished_req_ids.tolist() == [1] and plan.finished_reasons.tolist() == [3]
    s.update(plan, [9])
    plan = s.schedule(now=60.0)
    assert plan.finished_req_ids.tolist() == [2] and plan.finished_reasons.tolist() == [4]
    s.update(plan, [])
    stats = s.stats()
    assert stats["num_used_blocks"] == 0 and stats["num_unfinished_requests"] == 0
    assert not s.has_unfinished_requests()
