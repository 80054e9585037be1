"""The bench's pieces alone: prompts, arrivals, metrics, and its flags' errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from openai_double import Double, serving_double

from ferrollm.bench.datasets import DatasetError, jsonl_requests, random_requests
from ferrollm.bench.loadgen import RequestResult, arrival_times
from ferrollm.bench.metrics import MetricOptions, summarize
from ferrollm.cli import main


def test_random_prompts_repeat_with_their_seed_only() -> None:
    first = random_requests(5, 20, 8, seed=7)
    assert first == random_requests(5, 20, 8, seed=7)
    other = random_requests(5, 20, 8, seed=8)
    assert all(a.prompt != b.prompt for a, b in zip(first, other, strict=True))
    # An index is the same prompt whatever the count, so sweep levels can take their own.
    assert random_requests(2, 20, 8, seed=7, first_index=3) == first[3:5]
    assert len({r.prompt for r in first}) == 5
    assert all(r.output_len == 8 and r.prompt_len == 21 for r in first)


def test_the_range_ratio_bounds_the_lengths() -> None:
    requests = random_requests(200, 100, 50, range_ratio=0.5, seed=0)
    inputs = [r.prompt_len - 1 for r in requests]
    outputs = [r.output_len for r in requests]
    assert 50 <= min(inputs) < 60 and 140 < max(inputs) <= 150
    assert min(outputs) >= 25 and max(outputs) <= 75


def test_a_jsonl_dataset(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    lines = [{"prompt": "one two", "output_len": 3}, {"prompt": "three"}, {"prompt": "four"}]
    path.write_text("\n".join(map(json.dumps, lines)) + "\n\n")
    requests = jsonl_requests(path, 2, output_len=9)
    assert [(r.prompt, r.output_len, r.prompt_len) for r in requests] == [
        ("one two", 3, 2),
        ("three", 9, 1),
    ]
    path.write_text('{"prompt": "x"}\n{"text": "y"}\n')
    with pytest.raises(DatasetError, match=r"prompts.jsonl:2: expected an object"):
        jsonl_requests(path, 5, 9)


def test_poisson_arrivals_are_seeded() -> None:
    times = arrival_times(400, 10.0, seed=3)
    assert np.array_equal(times, arrival_times(400, 10.0, seed=3))
    assert not np.array_equal(times, arrival_times(400, 10.0, seed=4))
    assert times[0] == 0 and (np.diff(times) >= 0).all()
    assert np.mean(np.diff(times)) == pytest.approx(0.1, rel=0.2)
    assert not arrival_times(5, math.inf, seed=3).any()


def test_a_request_rate_spreads_the_sends() -> None:
    with serving_double(Double(0.0, 0.0, 0.0, 1)) as double:
        argv = ["bench", "serve", "--base-url", double.url, "--num-prompts", "4",
                "--request-rate", "20", "--seed", "0", "--disable-tqdm"]  # fmt: skip
        assert main(argv) == 0
    assert len(double.bodies) == 4


def test_summarize_matches_numpy() -> None:
    results = [
        RequestResult(True, ttft=0.1 * i, e2el=0.1 * i + 0.3, itls=[0.1, 0.2], input_len=5,
                      output_len=3)
        for i in range(1, 6)
    ] + [RequestResult(False, error="boom")]  # fmt: skip
    options = MetricOptions(("ttft", "itl", "tpot"), (50.0, 90.0, 99.9), {"ttft": 250.0})
    summary = summarize(results, 2.0, options)
    ttfts = [100.0, 200.0, 300.0, 400.0, 500.0]
    assert (summary["completed"], summary["failed"]) == (5, 1)
    assert summary["request_goodput"] == 2 / 2.0  # ttft 100 and 200 ms meet 250
    assert summary["p90_ttft_ms"] == pytest.approx(np.percentile(ttfts, 90))
    assert summary["p99.9_ttft_ms"] == pytest.approx(np.percentile(ttfts, 99.9))
    assert summary["median_itl_ms"] == pytest.approx(150.0)
    assert summary["mean_tpot_ms"] == pytest.approx(150.0)  # 300 ms over 2 tokens
    assert summary["total_token_throughput"] == (25 + 15) / 2.0
    assert "mean_e2el_ms" not in summary


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-concurrency", "1,0"], "argument --max-concurrency: must be a positive integer"),
        (["--request-rate", "0"], "argument --request-rate: must be > 0"),
        (["--goodput", "ttft"], "argument --goodput: expected METRIC:MS"),
        (["--goodput", "ttft:-1"], "an SLO must be > 0 ms"),
        (["--percentile-metrics", "ttft,foo"], "unknown metric 'foo'"),
        (["--metric-percentiles", "50,120"], "percentiles must be in (0, 100]"),
        (["--random-range-ratio", "1.5"], "argument --random-range-ratio: must be in [0, 1)"),
        (["--num-prompts", "x"], "argument --num-prompts: invalid _positive_int value"),
        (["--endpoint", "/v2/generate"], "argument --endpoint: invalid choice"),
        (["--dataset-name", "jsonl"], "ferrollm bench serve: error: --dataset-name jsonl needs"),
    ],
)
def test_bad_flags_are_argparse_errors(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "serve", "--model", "m", *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_an_unreachable_server_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "serve", "--base-url", "http://127.0.0.1:9", "--num-prompts", "1"])
    assert exit_info.value.code == 2
    assert "cannot list the models" in capsys.readouterr().err
