"""Request path: microseconds from a body's bytes to its `EngineRequest`s (decode, validate,
chat template, tokenize, prompt-token rules), with the server's own helpers and the default
model's tokenizer. One line per body:

    request_path body=chat us=412.3 (median of 200; p10 398.1, p90 431.0)

Bodies: a 6-message chat, a MindIE generate body, a 64-prompt completions batch and a 1 MiB
completions prompt. Run: ``python benches/request_path.py [--repeat N] [--smoke]``
(``--smoke``: 5 runs per body, that the bench still runs; the test suite runs it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from ferrollm import Limits
from ferrollm.default_model import default_model_path
from ferrollm.engine.request import EngineRequest
from ferrollm.executor.loader import load_model_source
from ferrollm.server.context import ServerContext
from ferrollm.server.metrics import Metrics
from ferrollm.server.routes.common import accept_body, engine_request
from ferrollm.server_config import ServerConfig
from ferrollm.tokenizer import Tokenizer

WORDS = "the quick brown fox jumps over the lazy dog while a model answers questions about it"
#: --smoke: every body, a few runs each (the 1 MiB prompt's floor of 5 included).
SMOKE = {"repeat": 5}


def text(num_chars: int) -> str:
    words = (WORDS + " ") * (num_chars // len(WORDS) + 1)
    return words[:num_chars]


def bodies() -> dict[str, tuple[str, bytes]]:
    chat = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": text(300)},
            {"role": "assistant", "content": text(200)},
            {"role": "user", "content": [{"type": "text", "text": text(150)}]},
            {"role": "assistant", "content": text(120)},
            {"role": "user", "content": "And then?"},
        ],
        "max_tokens": 64,
        "temperature": 0.7,
        "stop": ["\n\n"],
    }
    generate = {
        "id": "req-1",
        "text_input": text(400),
        "parameters": {"max_new_tokens": 64, "temperature": 0.8, "top_k": 20, "details": True},
    }
    batch = {"model": "m", "prompt": [text(200 + i) for i in range(64)], "max_tokens": 16}
    big = {"model": "m", "prompt": text(1 << 20), "max_tokens": 16}
    encode = json.dumps
    return {
        "chat": ("chat", encode(chat).encode()),
        "mindie": ("generate", encode(generate).encode()),
        "batch64": ("completions", encode(batch).encode()),
        "prompt1MiB": ("completions", encode(big).encode()),
    }


def to_engine_requests(ctx: ServerContext, route: str, raw: bytes) -> list[EngineRequest]:
    """What the handlers do before the engine: one validation, then per prompt the template
    (chat), the tokenizer and the prompt-token rules."""
    arrival = time.perf_counter()
    valid = accept_body(ctx, route, raw)
    if route == "chat":
        ids = ctx.tokenizer.encode_chat(valid.template_messages, valid.tools)
        return [engine_request(valid, "chat-0", ids, arrival)]
    return [
        engine_request(valid, f"r-{i}", ctx.tokenizer.encode(p), arrival, prompt=p, index=i)
        for i, p in enumerate(valid.prompts)
    ]


def bench(fn: Callable[[], Any], repeat: int) -> list[float]:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    return times


def context() -> ServerContext:
    """A server context with the default model's tokenizer and limits wide enough for a 1 MiB
    prompt: the bench measures the path, not a rejection."""
    tokenizer = Tokenizer.from_source(load_model_source(default_model_path()))
    n = 1 << 20
    limits = Limits(max_model_len=n + 1, max_input_tokens=n, max_iter_times=n)
    # The path reads only the task (a generation server) and the tokenizer.
    engine = SimpleNamespace(task="generate", tokenizer=tokenizer)
    config = ServerConfig(served_model_name="m")
    # The context registers its admission gauges with the metrics (nothing here scrapes them);
    # the engine's counters read as an idle engine's, all zero.
    metrics = Metrics("m", lambda: defaultdict(int))
    return ServerContext(engine, config, "m", limits, metrics)  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200, help="runs per body (the 1 MiB: /20)")
    parser.add_argument("--smoke", action="store_true", help="5 runs per body")
    args = parser.parse_args()
    if args.smoke:  # the smallest sizes; flags given still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    ctx = context()
    for name, (route, raw) in bodies().items():
        repeat = max(5, args.repeat // 20) if name == "prompt1MiB" else args.repeat
        times = bench(lambda route=route, raw=raw: to_engine_requests(ctx, route, raw), repeat)
        q = statistics.quantiles(times, n=10)
        print(
            f"request_path body={name} us={statistics.median(times):.1f} "
            f"(median of {repeat}; p10 {q[0]:.1f}, p90 {q[-1]:.1f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
