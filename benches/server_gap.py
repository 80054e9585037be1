"""What serving adds per token: offline batch-1 decode against the server's c1 inter-token latency.

Back to back in one run, on one prompt and one set of engine flags:

1. offline: `LLM` in this process steps one greedy `ignore_eos` request of `--max-tokens`
   tokens `--repeats` times; the time between consecutive decode steps, pooled, is the
   offline ms per token (p50).
2. server: `python -m ferrollm serve --port P [engine flags]` as a subprocess on 127.0.0.1
   (started after the offline engine is freed, so the two never share the CPU; `--port` by
   default a free one); one warm-up request, then
   `--repeats` streaming POST /v1/completions with the same prompt and parameters, one at a
   time; the gaps between consecutive non-empty text chunks, pooled, give the ITL p50.

One line, comparable across runs (ratio = server ITL p50 / offline ms per token; 1.0 means
serving adds nothing per token):

  server_gap offline_ms_per_tok=.. server_itl_p50_ms=.. ratio=.. offline_mean_ms=..
             server_itl_mean_ms=.. tokens=128 repeats=3 dtype=.. threads=..

Every argument the bench does not know is an engine/server flag of `ferrollm serve` (`MODEL`,
`--dtype`, `--device`, `--max-num-seqs`, `--kv-cache-memory`, ...): the server gets it as
given and the offline `LLM` gets the same engine options, so the two always run the same
engine.

`--smoke`: 4 tokens, 1 repeat, both engines eager (`--compile off`: no inductor compile) with
a 256-token step budget, unless the flags say otherwise: that the bench still runs (the test
suite runs it).

Usage: python benches/server_gap.py [--max-tokens 128] [--repeats 3] [--port N]
         [--prompt TEXT] [--startup-timeout 300] [--smoke]
         [ferrollm serve flags, e.g. --dtype bfloat16]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import httpx
import torch

from ferrollm import SamplingParams
from ferrollm.cli import build_parser, serve_options
from ferrollm.config import EngineConfig
from ferrollm.engine.request import EngineRequest
from ferrollm.llm import LLM

PROMPT = "The history of the printing press begins"
#: --smoke: the smallest run of both sides.
SMOKE = {"max_tokens": 4, "repeats": 1}
#: --smoke's engine flags (each one only where the command line does not give it).
SMOKE_ENGINE = {"--compile": "off", "--max-num-batched-tokens": "256", "--max-model-len": "512",
                "--kv-cache-memory": "64MiB"}  # fmt: skip


def offline_gaps(
    options: dict[str, Any], prompt: str, max_tokens: int, repeats: int
) -> tuple[list[float], str]:
    """Seconds between consecutive decode steps of one batch-1 request, pooled over repeats;
    and the engine's dtype."""
    engine_names = {f.name for f in fields(EngineConfig)} - {"model"}
    llm = LLM(options.get("model"), **{k: v for k, v in options.items() if k in engine_names})
    engine = llm.engine
    ids = engine.tokenizer.encode(prompt)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0)
    gaps: list[float] = []
    for i in range(repeats + 1):  # the first run warms up
        engine.add_request(EngineRequest.of(f"gap-{i}", ids, params))
        stamps = []
        while engine.has_unfinished_requests():
            engine.step()
            stamps.append(time.perf_counter())
        if i > 0:  # stamps[0] ends the prefill step
            gaps += [b - a for a, b in itertools.pairwise(stamps[1:])]
    dtype = str(engine.runner.dtype).removeprefix("torch.")
    del llm, engine
    gc.collect()
    return gaps, dtype


def start_server(port: int, serve_flags: Sequence[str]) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "ferrollm", "serve", "--port", str(port), *serve_flags]
    command += ["--log-level", "warning"]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL)


def wait_ready(client: httpx.Client, server: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"server exited with {server.returncode} before it was ready")
        try:
            if client.get("/v2/health/ready").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"server not ready after {timeout:.0f}s")


def stream_gaps(client: httpx.Client, model: str, prompt: str, max_tokens: int) -> list[float]:
    """Seconds between consecutive non-empty text chunks of one streamed completion."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    stamps = []
    with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise SystemExit(f"{response.status_code}: {response.read().decode()}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("text"):
                stamps.append(time.perf_counter())
    return [b - a for a, b in itertools.pairwise(stamps)]


def server_gaps(
    port: int,
    serve_flags: Sequence[str],
    prompt: str,
    max_tokens: int,
    repeats: int,
    timeout: float,
) -> list[float]:
    server = start_server(port, serve_flags)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
            wait_ready(client, server, timeout)
            model = client.get("/v1/models").json()["data"][0]["id"]
            stream_gaps(client, model, prompt, 16)  # warm-up
            runs = [stream_gaps(client, model, prompt, max_tokens) for _ in range(repeats)]
            return [gap for gaps in runs for gap in gaps]
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: Sequence[str] | None = None) -> None:
    args, serve_flags = parse_args(argv)
    port = args.port or free_port()
    options = serve_options(build_parser().parse_args(["serve", *serve_flags]))
    offline, dtype = offline_gaps(options, args.prompt, args.max_tokens, args.repeats)
    served = server_gaps(
        port, serve_flags, args.prompt, args.max_tokens, args.repeats, args.startup_timeout
    )
    off_p50 = statistics.median(offline) * 1e3
    srv_p50 = statistics.median(served) * 1e3
    print(
        f"server_gap offline_ms_per_tok={off_p50:.2f} server_itl_p50_ms={srv_p50:.2f} "
        f"ratio={srv_p50 / off_p50:.3f} offline_mean_ms={statistics.fmean(offline) * 1e3:.2f} "
        f"server_itl_mean_ms={statistics.fmean(served) * 1e3:.2f} tokens={args.max_tokens} "
        f"repeats={args.repeats} dtype={dtype} threads={torch.get_num_threads()}/{os.cpu_count()}",
        flush=True,
    )


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", type=int, default=0, help="default: a free one")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--smoke", action="store_true", help="4 tokens, 1 repeat, eager")
    args, serve_flags = parser.parse_known_args(argv)
    if args.smoke:  # the smallest sizes; flags given still win
        parser.set_defaults(**SMOKE)
        args, serve_flags = parser.parse_known_args(argv)
        for flag, value in SMOKE_ENGINE.items():
            if not any(f == flag or f.startswith(f"{flag}=") for f in serve_flags):
                serve_flags += [flag, value]
    return args, serve_flags


if __name__ == "__main__":
    main()
