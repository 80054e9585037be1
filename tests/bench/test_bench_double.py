"""``ferrollm bench serve`` against a test double with known delays, and its plots.

The double (openai_double.py) answers every request with 4 text chunks: the first after 30 ms
(300 ms for every second request), the rest 20 ms apart. So the result file must show 4 of 8
TTFTs at >= 30 ms and 4 at >= 300 ms, ITLs of >= 20 ms, 4 output tokens and the double's 7
input tokens per request, and a goodput of half the requests under a 150 ms TTFT SLO. Lower
bounds are exact (the double sleeps at least that long); upper bounds leave room for a loaded
machine.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib.image
import numpy as np
import pytest
from openai_double import MODEL, Double, serving_double

from ferrollm.bench import plots
from ferrollm.cli import main

FAST_S, SLOW_S, ITL_S, NUM_TOKENS = 0.03, 0.3, 0.02, 4
#: Slack above a known delay for a loaded machine (seconds).
SLACK_S = 0.12


@pytest.fixture
def double() -> Iterator[Double]:
    with serving_double(Double(FAST_S, SLOW_S, ITL_S, NUM_TOKENS)) as served:
        yield served


def run_bench(
    double: Double, out: Path, *flags: str, name: str = "r.json", plots: bool = False
) -> dict[str, Any]:
    """Run ``bench serve`` on the double, saving into ``out`` (the plots too if ``plots``);
    the result document."""
    argv = ["bench", "serve", "--base-url", double.url, "--num-prompts", "8",
            "--random-input-len", "16", "--random-output-len", str(NUM_TOKENS), "--seed", "1",
            "--disable-tqdm", "--save-result", "--result-dir", str(out),
            "--result-filename", name, *flags]  # fmt: skip
    assert main(argv if plots else [*argv, "--no-plots"]) == 0
    document: dict[str, Any] = json.loads((out / name).read_text())
    return document


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, Double]:
    """One run with its plots, shared by the tests that read it: the document, its folder
    and the double it ran against."""
    out = tmp_path_factory.mktemp("saved")
    flags = ("--max-concurrency", "4", "--goodput", "ttft:150", "--metric-percentiles", "50,99")
    with serving_double(Double(FAST_S, SLOW_S, ITL_S, NUM_TOKENS)) as double:
        return run_bench(double, out, *flags, plots=True), out, double


@pytest.fixture
def result(saved: tuple[dict[str, Any], Path, Double]) -> dict[str, Any]:
    return saved[0]


def test_the_result_file_holds_the_doubles_delays_and_counts(
    saved: tuple[dict[str, Any], Path, Double],
) -> None:
    result, _, double = saved
    assert result["model"] == MODEL and result["label"] == "server"
    assert result["goodput_slos_ms"] == {"ttft": 150.0}
    [run] = result["runs"]
    assert run["max_concurrency"] == 4 and run["num_prompts"] == 8
    assert (run["completed"], run["failed"]) == (8, 0)
    assert run["errors"] == [""] * 8
    assert run["total_output_tokens"] == 8 * NUM_TOKENS
    assert run["total_input_tokens"] == 8 * double.prompt_tokens  # the server's usage
    ttfts = np.sort(run["ttfts_ms"])
    assert (ttfts[:4] >= FAST_S * 1e3).all() and (ttfts[:4] < (FAST_S + SLACK_S) * 1e3).all()
    assert (ttfts[4:] >= SLOW_S * 1e3).all() and (ttfts[4:] < (SLOW_S + SLACK_S) * 1e3).all()
    itls = np.concatenate(run["itls_ms"])
    assert len(itls) == 8 * (NUM_TOKENS - 1)
    assert ITL_S * 1e3 * 0.9 <= run["median_itl_ms"] < (ITL_S + SLACK_S) * 1e3
    assert run["median_ttft_ms"] == pytest.approx(np.median(ttfts))
    assert run["p99_ttft_ms"] == pytest.approx(np.percentile(ttfts, 99))
    assert {"mean_tpot_ms", "p50_tpot_ms", "p99_e2el_ms", "std_itl_ms"} <= set(run)
    # Half the requests miss the 150 ms TTFT SLO.
    assert run["request_goodput"] == pytest.approx(4 / run["duration"])
    assert run["request_throughput"] == pytest.approx(8 / run["duration"])
    assert run["output_throughput"] == pytest.approx(8 * NUM_TOKENS / run["duration"])


def test_the_requests_are_streaming_completions_with_distinct_prompts(
    saved: tuple[dict[str, Any], Path, Double],
) -> None:
    double = saved[2]
    assert len(double.bodies) == 8
    assert len({body["prompt"] for body in double.bodies}) == 8
    for body in double.bodies:
        assert body["model"] == MODEL and body["stream"] is True
        assert body["max_tokens"] == NUM_TOKENS and "ignore_eos" not in body
        assert body["stream_options"] == {"include_usage": True}


def test_chat_endpoint_ignore_eos_and_warmups(double: Double, tmp_path: Path) -> None:
    flags = ("--endpoint", "/v1/chat/completions", "--ignore-eos", "--num-warmups", "2")
    result = run_bench(double, tmp_path, *flags)
    assert result["runs"][0]["total_output_tokens"] == 8 * NUM_TOKENS
    assert len(double.bodies) == 2 + 8  # the warm-ups are sent, not counted
    assert all(body["ignore_eos"] is True and "messages" in body for body in double.bodies)


def test_a_sweep_runs_one_level_each_with_its_own_prompts(double: Double, tmp_path: Path) -> None:
    result = run_bench(double, tmp_path, "--max-concurrency", "1,2,4", "--num-prompts", "2")
    assert [run["max_concurrency"] for run in result["runs"]] == [1, 2, 4]
    assert [run["completed"] for run in result["runs"]] == [2, 2, 2]
    assert len({body["prompt"] for body in double.bodies}) == 6  # no prefix-cache reuse


def test_the_pngs_exist_and_are_drawn(saved: tuple[dict[str, Any], Path, Double]) -> None:
    tmp_path = saved[1]
    for name in ("throughput", "latency", "ttft-cdf", "itl-cdf"):
        image = matplotlib.image.imread(tmp_path / f"r-{name}.png")
        assert image.shape[0] > 100 and image.shape[1] > 100
        assert image[..., :3].std() > 0.01, f"{name} is blank"


def test_the_html_report_embeds_every_png(saved: tuple[dict[str, Any], Path, Double]) -> None:
    tmp_path = saved[1]
    page = (tmp_path / "r.html").read_text()
    embedded = [part.split('"')[0] for part in page.split("data:image/png;base64,")[1:]]
    assert len(embedded) == 4
    pngs = {(tmp_path / f"r-{n}.png").read_bytes() for n in ("throughput", "latency")}
    assert pngs <= {base64.b64decode(data) for data in embedded}
    assert "<td>server</td>" in page and 'src="http' not in page


def test_the_figures_draw_the_jsons_numbers(result: dict[str, Any]) -> None:
    [run] = result["runs"]
    left, right = plots.throughput_figure([result]).axes
    assert (left.get_xlabel(), left.get_ylabel()) == ("max concurrency", "output tokens/s")
    assert right.get_ylabel() == "requests/s"
    assert list(left.lines[0].get_xdata()) == [4]
    assert list(left.lines[0].get_ydata()) == [run["output_throughput"]]
    assert list(right.lines[0].get_ydata()) == [run["request_throughput"]]
    latency = {ax.get_ylabel(): ax for ax in plots.latency_figure([result]).axes if ax.lines}
    assert set(latency) == {f"{n} median (ms)" for n in ("TTFT", "TPOT", "ITL", "E2E latency")}
    assert list(latency["TTFT median (ms)"].lines[0].get_ydata()) == [run["median_ttft_ms"]]
    [cdf] = plots.cdf_figure([result], "ttft").axes
    assert (cdf.get_xlabel(), cdf.get_ylabel()) == ("TTFT (ms)", "fraction of requests")
    assert list(cdf.lines[0].get_xdata()) == sorted(run["ttfts_ms"])
    assert cdf.lines[0].get_ydata()[-1] == 1.0
    [itl] = plots.cdf_figure([result], "itl").axes
    assert len(itl.lines[0].get_xdata()) == 8 * (NUM_TOKENS - 1)


def test_bench_plot_overlays_two_files(double: Double, tmp_path: Path) -> None:
    first = run_bench(double, tmp_path, "--label", "ferrollm", name="a.json")
    run_bench(double, tmp_path, "--label", "llama-server", name="b.json")
    out = tmp_path / "overlay"
    argv = ["bench", "plot", str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    assert main([*argv, "--output-dir", str(out), "--name", "both"]) == 0
    assert {p.name for p in out.iterdir()} == {
        "both-throughput.png", "both-latency.png", "both-ttft-cdf.png", "both-itl-cdf.png",
        "both.html",
    }  # fmt: skip
    documents = [json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json")]
    for figure in plots.figures(documents).values():
        for ax in figure.axes:
            if ax.get_visible():
                labels = [line.get_label() for line in ax.lines]
                assert len(labels) == 2 and labels[0].startswith("ferrollm"), labels
                assert labels[1].startswith("llama-server")
    ax = plots.throughput_figure(documents).axes[0]
    assert ax.lines[0].get_ydata()[0] == first["runs"][0]["output_throughput"]


def test_bench_plot_tells_files_of_one_label_apart(double: Double, tmp_path: Path) -> None:
    for name in ("x.json", "y.json"):
        run_bench(double, tmp_path, "--num-prompts", "2", name=name)
    assert main(["bench", "plot", str(tmp_path / "x.json"), str(tmp_path / "y.json")]) == 0
    page = (tmp_path / "x-vs-y.html").read_text()
    assert "server (x)" in page and "server (y)" in page
