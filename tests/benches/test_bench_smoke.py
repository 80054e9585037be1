"""Every script in benches/ runs in its smoke mode and prints its result lines.

Benchmarks rot when nothing runs them. ``python benches/X.py --smoke`` is the bench's own code
path at its smallest sizes (a few seconds; the servers a bench starts listen on 127.0.0.1
only), run here as a user runs it: a subprocess from the repository root, with ``TMPDIR`` in
the test's tmp_path so that server logs and scratch models go away with it, and one OpenMP
thread (``OWN_THREADS`` says why). The scripts are globbed, so a new bench is run too, and
fails here until ``RESULT_LINES`` names its line.
Speed is not asserted (benchmarks, not timed tests); what each bench says must hold is (no
errors, no lost requests, the KV blocks back at their baseline).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(path.name for path in (ROOT / "benches").glob("*.py"))
#: A smoke run takes seconds; this is for a loaded machine (or a cold cargo build).
TIMEOUT_S = 300
NUM = r"[\d.]+"

#: Script -> patterns that lines of its output must match (each from a line's start).
RESULT_LINES: dict[str, list[str]] = {
    "attention.py": [
        rf"decode float32  batch  1 context  128: sdpa-gather +{NUM} ms  kernel +{NUM} ms",
        rf"decode bfloat16 batch  1 context  128: sdpa-gather +{NUM} ms  kernel +{NUM} ms",
    ],
    "beam.py": [
        rf"beam width=2: ferrollm f32 {NUM} tok/s \(fast mode {NUM}\), peak KV blocks \d+$",
        r"KV blocks: beam group of 2 \d+, 2 independent sequences \d+",
    ],
    "cuda_decode.py": [
        rf"bandwidth device=cpu copy=0.06 GiB: {NUM} GB/s",
        rf"decode batch=1 graphs=off: {NUM} tok/s, step {NUM} ms, floor {NUM} ms \(weights "
        rf"{NUM} GB \+ kv {NUM} GB at {NUM} GB/s\), \d+% of roofline$",
        rf"decode batch=2 graphs=off: {NUM} tok/s",
        rf"prefill len=32 graphs=off: {NUM} tok/s",
        r"  failed: none$",
    ],
    "embed.py": [rf"embed batch   1: ferrollm +{NUM} texts/s  sentence-transformers +{NUM}"],
    "grammar_backends.py": [
        rf"grammar_backends backend=ferrollm-llguidance rows1={NUM} \S+ rows32={NUM} \S+$",
        r"grammar_backends backend=xgrammar ",
        r"grammar_backends backend=outlines-core ",
    ],
    "linear.py": [
        rf"linear shape=qkv K=576 N=960 M=1 f32_us={NUM} .* best=\w+$",
        rf"linear shape=mlp K=576 N=1536 M=1 fused_us={NUM} unfused_us={NUM} speedup={NUM}$",
        rf"linear copy_bandwidth_GBs={NUM}",
    ],
    "lora.py": [
        rf"lora adapters=0 concurrency=4 rank=4: {NUM} tok/s, {NUM}x the base \({NUM} tok/s\)",
        rf"lora adapters=2 concurrency=4 rank=4: {NUM} tok/s, {NUM}x the base",
    ],
    "lora_layers.py": [
        rf"lora_layers shape=qkv T=8 dtype=float32 base_us={NUM} masked_us={NUM} "
        rf"masked_bd_us={NUM} segmented_us={NUM} gathered_us={NUM}",
    ],
    "multimodal.py": [
        rf"multimodal conc={c} requests=2 image {NUM} req/s ttft_p50 {NUM} ms \| text {NUM} "
        rf"req/s ttft_p50 {NUM} ms \(prompt (\d+) tokens, \d+ image-related"
        for c in (1, 2)
    ]
    + [
        rf"multimodal encoder_cache repeated_image requests=2 on ttft_p50 {NUM} ms "
        rf"\(tile hits [1-9]\d*\) \| off ttft_p50 {NUM} ms \(tile encodes [1-9]\d*\)"
    ],
    "moe.py": [rf"batch   1: +{NUM} tok/s, expert dispatch +{NUM}% of the time, sparse blocks"],
    "overload.py": [
        rf"capacity clients=2 rps={NUM}",
        r"overload level=5x clients=10 accepted=\d+ rejected=\d+ errors=0 lost=0 ",
    ],
    "request_path.py": [
        rf"request_path body={body} us={NUM} \(median of \d+;"
        for body in ("chat", "mindie", "batch64", "prompt1MiB")
    ],
    "sampler.py": [
        rf"sampler.py filtered rows=1   vocab=49152  ferrollm_ms= *{NUM} torch_ms= *{NUM}",
        rf"sampler.py greedy   rows=1   vocab=49152  ferrollm_ms= *{NUM} torch_ms= *{NUM}",
    ],
    "scheduler.py": [
        rf"scheduler.py steady_decode num_seqs={n} us_per_step={NUM}" for n in (64, 256, 1024)
    ],
    "serve.py": [rf"serve label=ferrollm conc=2 requests=4 out_tok/s={NUM} .* errors=0$"],
    "server_gap.py": [
        rf"server_gap offline_ms_per_tok={NUM} server_itl_p50_ms={NUM} ratio={NUM} .*tokens=4 "
    ],
    "soak.py": [
        r"soak requests=24 completed=\d+ disconnects=\d+ aborts=\d+ errors=0 .*"
        r"kv_used_start=(\d+) kv_used_end=\1 "
    ],
    "speculative.py": [
        rf"{workload} batch   1: plain +{NUM} tok/s \| ngram +{NUM} tok/s"
        for workload in ("quote", "free ")
    ],
    "stop.py": [rf"stop.py stops=100 delta_chars=32 rust_us_per_delta={NUM}"],
    "structured.py": [
        rf"structured conc=1 requests=2 unconstrained={NUM} tok/s json_schema={NUM} tok/s"
    ],
    "throughput.py": [rf"batch   1: ferrollm +{NUM} tok/s$"],
    "tp.py": [
        rf"tp=1 batch=  1: +{NUM} output tok/s",
        rf"tp=2 batch=  1: +{NUM} output tok/s",
        rf"batch=  1: tp=2 / tp=1 = {NUM}x",
        rf"tp=2 batch=1: collectives {NUM}% of a",
    ],
}
#: Scripts that need a tool besides the venv, and the tool.
NEEDS = {"grammar_backends.py": "cargo"}
#: Scripts that keep torch's own thread count: tp.py's ranks split the cores themselves (unless
#: OMP_NUM_THREADS is set), which is part of what it checks. The others get one OpenMP thread:
#: a smoke run checks the code path, not speed, and a pool of two stalls at every op while
#: another process holds a core (a bench's own server and clients, a shared machine). On a
#: loaded 2-core machine the suite took 5.7 min with two threads, 1.9 min with one.
OWN_THREADS = {"tp.py"}


def test_every_bench_has_its_result_lines() -> None:
    assert sorted(RESULT_LINES) == SCRIPTS, "name the result lines of each script in benches/"


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_smoke(script: str, tmp_path: Path) -> None:
    tool = NEEDS.get(script)
    if tool is not None and shutil.which(tool) is None:
        pytest.skip(f"{script} needs {tool}")
    returncode, stdout, stderr = run_smoke(script, tmp_path)
    output = f"stdout:\n{stdout[-4000:]}\nstderr:\n{stderr[-4000:]}"
    assert returncode == 0, output
    for pattern in RESULT_LINES.get(script, []):
        assert re.search(f"^{pattern}", stdout, re.MULTILINE), f"{pattern!r}\n{output}"


def run_smoke(script: str, tmp_path: Path) -> tuple[int, str, str]:
    """``script --smoke``'s exit status and output. Past the timeout it gets SIGINT first, so
    that its ``finally`` blocks stop the servers it started, then its process group SIGKILL."""
    command = [sys.executable, f"benches/{script}", "--smoke"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    if script not in OWN_THREADS:
        env.setdefault("OMP_NUM_THREADS", "1")
    with subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGINT)
            try:
                stdout, stderr = process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                stdout, stderr = process.communicate()
            pytest.fail(
                f"{script} --smoke ran past {TIMEOUT_S} s\n{stdout[-4000:]}{stderr[-4000:]}"
            )
    return process.returncode, stdout, stderr
