"""Structured output's cost when serving: `/v1/chat/completions` on the default model with and
without a ``json_schema`` response format (10 properties), at 1 and 32 concurrent clients,
side by side in one run against one server.

The two sides do the same work: each constrained request (temperature 1, seeded, ``max_tokens``
64) runs first, and its unconstrained twin (same prompt and seed, no grammar) then asks for
exactly as many tokens as the constrained one produced (``ignore_eos``), so short JSON answers
do not make the grammar side look cheaper or its tail emptier. Runs alternate and the best of
each side counts. One line per concurrency: output tokens/s for both, and the grammar's
overhead.

With ``--url`` it measures a running server; otherwise it starts ``ferrollm serve`` (default
model) on a free port of 127.0.0.1 for the run.

``--smoke``: 1 client, 2 requests of up to 8 tokens a side, 1 repeat, and a server it starts
with eager decode (``--compile off``: no inductor compile at start-up) and a 256-token step
budget: that the bench still runs (the test suite runs it).

Usage: python benches/structured.py [--url URL] [--concurrency 1 32] [--requests-per-client 4]
         [--tokens 64] [--repeats 3] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx

SCHEMA = {
    "type": "object",
    "properties": {
        **{f"field_{i}": {"type": "string", "maxLength": 12} for i in range(6)},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "score": {"type": "number"},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["field_0", "age", "active"],
}
MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]
#: --smoke: the smallest level.
SMOKE = {"concurrency": [1], "requests_per_client": 2, "tokens": 8, "repeats": 1}
#: --smoke's server (also benches/serve.py's): no inductor compile at start-up, a short
#: profiling pass, a small KV cache.
SMOKE_SERVER = ("--compile", "off", "--max-num-batched-tokens", "256", "--max-model-len", "1024",
                "--kv-cache-memory", "64MiB")  # fmt: skip


@contextlib.contextmanager
def served(url: str | None, flags: Sequence[str] = ()) -> Iterator[str]:
    """``url``, or a fresh ``ferrollm serve`` of the default model (with ``flags``) on a free
    port of 127.0.0.1 for the block."""
    if url is not None:
        yield url
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "ferrollm", "serve", "--port", str(port)]
    command += ["--max-num-seqs", "64", "--served-model-name", "bench", *flags]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ)
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if process.poll() is not None:
                raise SystemExit("ferrollm serve exited during start-up")
            time.sleep(0.5)
        else:
            raise SystemExit("ferrollm serve was not ready in 300 s")
        yield url
    finally:
        process.terminate()
        process.wait(30)


async def one(client: httpx.AsyncClient, model: str, seed: int, extra: dict[str, Any]) -> int:
    body = {"model": model, "messages": MESSAGES, "temperature": 1.0, "seed": seed, **extra}
    response = await client.post("/v1/chat/completions", json=body)
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"])


async def level(
    client: httpx.AsyncClient, model: str, conc: int, bodies: list[tuple[int, dict[str, Any]]]
) -> tuple[float, list[int]]:
    """Run ``bodies`` with ``conc`` clients; output tokens/s and each request's tokens."""
    queue = list(enumerate(bodies))
    counts = [0] * len(bodies)

    async def worker() -> None:
        while queue:
            i, (seed, extra) = queue.pop(0)
            counts[i] = await one(client, model, seed, extra)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conc)))
    return sum(counts) / (time.perf_counter() - start), counts


async def run(args: argparse.Namespace, url: str) -> None:
    limits = httpx.Limits(max_connections=max(args.concurrency) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
        await one(client, model, 0, {"max_tokens": 8, "response_format": fmt})  # warm-up
        print(f"# ferrollm serve, default model, /v1/chat/completions, max_tokens {args.tokens}")
        for conc in args.concurrency:
            seeds = range(1, conc * args.requests_per_client + 1)
            constrained = [(s, {"max_tokens": args.tokens, "response_format": fmt}) for s in seeds]
            free = grammar = 0.0
            for _ in range(args.repeats):
                rate, counts = await level(client, model, conc, constrained)
                grammar = max(grammar, rate)
                twins = [
                    (s, {"max_tokens": max(n, 1), "ignore_eos": True})
                    for s, n in zip(seeds, counts, strict=True)
                ]
                free = max(free, (await level(client, model, conc, twins))[0])
            print(
                f"structured conc={conc} requests={len(constrained)} unconstrained={free:.1f} "
                f"tok/s json_schema={grammar:.1f} tok/s overhead={100 * (1 - grammar / free):.1f}%"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="1 client, 2 requests, 8 tokens")
    args = parser.parse_args()
    if args.smoke:  # the smallest sizes; flags given still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    with served(args.url, SMOKE_SERVER if args.smoke else ()) as url:
        asyncio.run(run(args, url))


if __name__ == "__main__":
    main()
