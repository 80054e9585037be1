"""``ferrollm bench`` on a real tiny model: ``bench serve`` against a ``ferrollm serve``
process, and the offline ``bench throughput`` and ``bench latency``.

With ``--ignore-eos`` every request makes exactly ``--random-output-len`` tokens, which the
server's ``usage`` reports; the input lengths are the server's token counts too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.e2e_support import Server, serving
from ferrollm.cli import main
from tiny_models import build_tiny_model

#: The tiny model's engine options, offline (the server takes e2e_support's flags).
ENGINE_FLAGS = ["--device", "cpu", "--dtype", "float32", "--max-model-len", "256",
                "--kv-cache-memory", "8MiB", "--compile", "off"]  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("llama3", tmp_path_factory.mktemp("bench-model"))


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    flags = ("--compile", "off", "--served-model-name", "tiny", "--max-model-len", "256")
    with serving(tmp_path_factory.mktemp("bench-logs"), str(model_dir), *flags) as served:
        yield served


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_bench_serve_against_ferrollm(server: Server, endpoint: str, tmp_path: Path) -> None:
    argv = ["bench", "serve", "--base-url", server.url, "--endpoint", endpoint,
            "--num-prompts", "4", "--max-concurrency", "2", "--random-input-len", "8",
            "--random-output-len", "5", "--ignore-eos", "--label", "ferrollm", "--seed", "0",
            "--save-result", "--result-dir", str(tmp_path), "--result-filename", "f.json",
            "--no-plots", "--disable-tqdm"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((tmp_path / "f.json").read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # --no-plots
    assert result["model"] == "tiny" and result["endpoint"] == endpoint
    [run] = result["runs"]
    assert (run["completed"], run["failed"]) == (4, 0), run["errors"]
    assert run["output_lens"] == [5] * 4 and run["total_output_tokens"] == 20
    assert all(n > 8 for n in run["input_lens"])  # the tiny BPE splits words
    assert all(len(gaps) >= 1 for gaps in run["itls_ms"])
    assert run["median_ttft_ms"] > 0 and run["output_throughput"] > 0


def test_bench_throughput_offline(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "throughput.json"
    argv = ["bench", "throughput", "--model", str(model_dir), *ENGINE_FLAGS,
            "--num-prompts", "6", "--random-input-len", "12", "--random-output-len", "4",
            "--seed", "0", "--output-json", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["num_requests"] == 6
    assert result["total_output_tokens"] == 6 * 4 and result["total_input_tokens"] == 6 * 12
    assert result["tokens_per_second"] == pytest.approx((6 * 12 + 6 * 4) / result["elapsed_time"])


def test_bench_latency_offline(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "latency.json"
    argv = ["bench", "latency", "--model", str(model_dir), *ENGINE_FLAGS, "--input-len", "8",
            "--output-len", "4", "--batch-size", "2", "--num-iters-warmup", "1",
            "--num-iters", "3", "--output-json", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert (result["batch_size"], result["input_len"], result["output_len"]) == (2, 8, 4)
    assert len(result["latencies"]) == 3
    assert result["avg_latency"] == pytest.approx(sum(result["latencies"]) / 3)
    assert set(result["percentiles"]) == {"10", "25", "50", "75", "90", "99"}
    assert "Avg latency:" in capsys.readouterr().out
