"""Soak: many short requests with random disconnects and aborts, against a server it starts.

`--num-requests` (default 20,000) requests go out from `--concurrency` closed-loop clients;
each is, at random: a whole completion (`max_tokens` 1-8), a stream read to its end, a stream
the client drops after its first event (a disconnect), or a request cancelled at a random
moment within 50 ms (an abort). At the end one line:

  soak requests=.. completed=.. disconnects=.. aborts=.. errors=0 rss_start=..MB rss_end=..MB
       rss_growth=..MB kv_used_start=.. kv_used_end=.. seconds=..

RSS is the Granian worker's (the process holding the engine), after a warm-up of `--warmup`
(200) requests and again once every request has ended; KV blocks in use come from /metrics and
must be back at their baseline (polled for up to 30 s while aborted requests are dropped).
Errors are any answer other than 200 to a request the client did not cut (must be 0).

``--smoke``: 24 requests from 4 clients after a warm-up of 4: that the bench still runs (the
test suite runs it).

Usage: python benches/soak.py [--num-requests 20000] [--concurrency 16] [--seed 0]
                              [--warmup 200] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from overload import start_server

MODEL = "SmolLM2-135M-Instruct.Q4_1"
#: --smoke: enough requests that each kind (completion, stream, disconnect, abort) occurs.
SMOKE = {"num_requests": 24, "concurrency": 4, "warmup": 4}


@dataclass
class Counts:
    completed: int = 0
    disconnects: int = 0
    aborts: int = 0
    errors: int = 0


def worker_rss_mb(main_pid: int) -> float:
    """RSS of the largest process in the server's tree (the Granian worker)."""
    best = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        pid, ppid = int(fields["Pid"]), int(fields["PPid"])
        if main_pid in (pid, ppid) and "VmRSS" in fields:
            best = max(best, int(fields["VmRSS"].split()[0]))
    return best / 1024


async def one(http: httpx.AsyncClient, rng: random.Random, counts: Counts) -> None:
    kind = rng.random()
    body = {"model": MODEL, "prompt": f"Item {rng.randrange(10**6)}:",
            "max_tokens": rng.randint(1, 8), "temperature": 0}  # fmt: skip
    if kind < 0.5:
        response = await http.post("/v1/completions", json=body)
        if response.status_code == 200:
            counts.completed += 1
        else:
            counts.errors += 1
            print(f"error: {response.status_code} {response.text[:200]}", file=sys.stderr)
    elif kind < 0.7:
        async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            data = b"".join([chunk async for chunk in r.aiter_bytes()])
        if r.status_code == 200 and data.endswith(b"data: [DONE]\n\n"):
            counts.completed += 1
        else:
            counts.errors += 1
            print(f"error: stream {r.status_code} {data[-200:]!r}", file=sys.stderr)
    elif kind < 0.85:
        body["max_tokens"] = 64
        async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            async for _ in r.aiter_bytes():
                break  # drop the connection after the first event
        counts.disconnects += 1
    else:
        task = asyncio.create_task(http.post("/v1/completions", json={**body, "max_tokens": 64}))
        await asyncio.sleep(rng.random() * 0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        counts.aborts += 1


async def run(url: str, num: int, concurrency: int, seed: int) -> Counts:
    counts = Counts()
    rng = random.Random(seed)
    remaining = iter(range(num))
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:

        async def client() -> None:
            for _ in remaining:
                try:
                    await one(http, rng, counts)
                except httpx.HTTPError as e:
                    counts.errors += 1
                    print(f"error: {e!r}", file=sys.stderr)

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return counts


def kv_used(url: str) -> int:
    text = httpx.get(f"{url}/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("ferrollm_kv_blocks_used{"))
    return int(float(line.rsplit(" ", 1)[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-waiting-requests", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=200, help="requests before RSS is read")
    parser.add_argument("--smoke", action="store_true", help="24 requests, 4 clients")
    args = parser.parse_args()
    if args.smoke:  # the smallest sizes; flags given still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    process, url = start_server(args)
    try:
        asyncio.run(run(url, args.warmup, args.concurrency, args.seed + 1))  # warm-up
        rss_start, kv_start = worker_rss_mb(process.pid), kv_used(url)
        started = time.monotonic()
        counts = asyncio.run(run(url, args.num_requests, args.concurrency, args.seed))
        seconds = time.monotonic() - started
        deadline = time.monotonic() + 30
        while kv_used(url) != kv_start and time.monotonic() < deadline:
            time.sleep(0.2)
        rss_end, kv_end = worker_rss_mb(process.pid), kv_used(url)
        print(
            f"soak requests={args.num_requests} completed={counts.completed} "
            f"disconnects={counts.disconnects} aborts={counts.aborts} errors={counts.errors} "
            f"rss_start={rss_start:.0f}MB rss_end={rss_end:.0f}MB "
            f"rss_growth={rss_end - rss_start:.1f}MB kv_used_start={kv_start} "
            f"kv_used_end={kv_end} seconds={seconds:.0f}",
            flush=True,
        )
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)


if __name__ == "__main__":
    main()
