"""Overload: closed-loop load at 1x, 2x and 5x the measured capacity, against a server it starts.

The server (`ferrollm serve` on the default model, CPU parity mode) gets admission bounds
(`--max-waiting-requests`, default 8). Capacity is measured first: `--base-clients` closed-loop
clients for `--seconds` give the sustainable request rate. Each level then runs level x
base-clients clients for `--seconds`; a client whose request is refused with 503 waits
`--backoff` seconds (not the Retry-After, so that the load stays at the level) and sends again.
One line per level:

  overload level=2x clients=16 accepted=.. rejected=.. errors=0 lost=0 rps=..
           accepted_p50=..s accepted_p99=..s reject_p99=..ms retry_after=[lo, hi]

- accepted: 200s; rejected: 503s; errors: any other status or a broken response; lost:
  requests sent that never got an answer before the level's grace period ended (must be 0).
- accepted latency: send -> whole response; reject latency: send -> the 503.

``--smoke``: 2 base clients, 2-second levels (a 1-second warm-up), the 5x level only, 4 tokens,
2 waiting requests at most (so that some are refused): that the bench still runs (the test
suite runs it).

Usage: python benches/overload.py [--base-clients 8] [--seconds 20] [--levels 1 2 5]
                                   [--max-tokens 16] [--max-waiting-requests 8] [--url URL]
                                   [--warmup-seconds 3] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import httpx

SERVER_FLAGS = ["--dtype", "float32", "--quantization", "none", "--max-model-len", "1024",
                "--kv-cache-memory", "256MiB", "--max-num-batched-tokens", "256"]  # fmt: skip
#: --smoke: one short level past capacity, with a queue bound low enough to refuse some.
SMOKE = {"base_clients": 2, "seconds": 2, "warmup_seconds": 1, "levels": [5], "max_tokens": 4,
         "max_waiting_requests": 2}  # fmt: skip


@dataclass
class Level:
    accepted: list[float] = field(default_factory=list)
    rejected: list[float] = field(default_factory=list)
    retry_after: list[int] = field(default_factory=list)
    errors: int = 0
    sent: int = 0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def client_loop(
    http: httpx.AsyncClient, body: dict[str, object], until: float, level: Level, backoff: float
) -> None:
    while time.monotonic() < until:
        level.sent += 1
        started = time.monotonic()
        try:
            response = await http.post("/v1/completions", json=body)
        except httpx.HTTPError as e:
            level.errors += 1
            print(f"error: {e!r}", file=sys.stderr)
            continue
        elapsed = time.monotonic() - started
        if response.status_code == 200 and response.json()["choices"]:
            level.accepted.append(elapsed)
        elif response.status_code == 503:
            level.rejected.append(elapsed)
            level.retry_after.append(int(response.headers.get("retry-after", "0")))
            await asyncio.sleep(backoff)
        else:
            level.errors += 1
            print(f"error: {response.status_code} {response.text[:200]}", file=sys.stderr)


async def run_level(url: str, clients: int, seconds: float, args: argparse.Namespace) -> Level:
    level = Level()
    body = {"model": args.model, "prompt": "Once upon a time", "max_tokens": args.max_tokens,
            "ignore_eos": True, "temperature": 0}  # fmt: skip
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        until = time.monotonic() + seconds
        tasks = [
            asyncio.create_task(client_loop(http, body, until, level, args.backoff))
            for _ in range(clients)
        ]
        await asyncio.wait(tasks, timeout=seconds + 300)  # the grace period for the last ones
        for task in tasks:
            task.cancel()
    return level


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fd, log_name = tempfile.mkstemp(prefix="ferrollm-bench-server-", suffix=".log")
    command = [sys.executable, "-m", "ferrollm", "serve", "--port", str(port), *SERVER_FLAGS,
               "--max-waiting-requests", str(args.max_waiting_requests)]  # fmt: skip
    with os.fdopen(fd, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"the server exited; see {log_name}")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                print(f"server log: {log_name}", file=sys.stderr)
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    os.killpg(process.pid, signal.SIGKILL)
    sys.exit("the server was not ready in 300 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="an already running server (else one is started)")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct.Q4_1")
    parser.add_argument("--base-clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--levels", type=float, nargs="+", default=[1, 2, 5])
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-waiting-requests", type=int, default=8)
    parser.add_argument("--backoff", type=float, default=0.05)
    parser.add_argument("--warmup-seconds", type=float, default=3)
    parser.add_argument("--smoke", action="store_true", help="2 clients, 2 s, the 5x level")
    args = parser.parse_args()
    if args.smoke:  # the smallest sizes; flags given still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    process = None
    url = args.url
    if url is None:
        process, url = start_server(args)
    try:
        warm = asyncio.run(run_level(url, args.base_clients, args.warmup_seconds, args))
        capacity = asyncio.run(run_level(url, args.base_clients, args.seconds, args))
        rps = len(capacity.accepted) / args.seconds
        print(f"capacity clients={args.base_clients} rps={rps:.2f} "
              f"p50={statistics.median(capacity.accepted):.3f}s "
              f"(warm-up {len(warm.accepted)} requests)")  # fmt: skip
        for factor in args.levels:
            clients = round(factor * args.base_clients)
            level = asyncio.run(run_level(url, clients, args.seconds, args))
            answered = len(level.accepted) + len(level.rejected) + level.errors
            retry = (
                f"[{min(level.retry_after)}, {max(level.retry_after)}]"
                if level.retry_after
                else "-"
            )
            print(
                f"overload level={factor:g}x clients={clients} accepted={len(level.accepted)} "
                f"rejected={len(level.rejected)} errors={level.errors} "
                f"lost={level.sent - answered} rps={len(level.accepted) / args.seconds:.2f} "
                f"accepted_p50={percentile(level.accepted, 0.5):.3f}s "
                f"accepted_p99={percentile(level.accepted, 0.99):.3f}s "
                f"reject_p99={percentile(level.rejected, 0.99) * 1e3:.1f}ms retry_after={retry}",
                flush=True,
            )
    finally:
        if process is not None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
