"""``ferrollm bench throughput`` and ``bench latency``: the offline `ferrollm.LLM`, as
``vllm bench throughput`` and ``vllm bench latency`` measure it.

throughput: every prompt at once through one ``LLM.generate`` call; requests/s, total and
output tokens/s over its wall time. latency: one batch of ``batch_size`` prompts of exactly
``input_len`` tokens, generating exactly ``output_len`` (``ignore_eos``), timed end to end
``num_iters`` times after ``num_iters_warmup`` untimed runs; the mean and percentiles.
Prompts are the random word prompts of `ferrollm.bench.datasets` (or a JSONL file), cut to
their token counts with the model's tokenizer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ferrollm._core import SamplingParams
from ferrollm.bench.datasets import SampleRequest
from ferrollm.llm import LLM


def token_prompts(
    llm: LLM, requests: Sequence[SampleRequest], input_len: int | None
) -> list[list[int]]:
    """The prompts as token ids; cut to ``input_len`` tokens when it is given."""
    tokenizer = llm.get_tokenizer()
    prompts = [list(tokenizer.encode(r.prompt)) for r in requests]
    return prompts if input_len is None else [p[:input_len] for p in prompts]


def run_throughput(
    llm: LLM, requests: Sequence[SampleRequest], input_len: int | None, ignore_eos: bool = True
) -> dict[str, Any]:
    """All prompts in one ``generate`` call: counts, elapsed time and throughputs."""
    prompts = token_prompts(llm, requests, input_len)
    params = [
        SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=ignore_eos)
        for r in requests
    ]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    input_tokens = sum(map(len, prompts))
    output_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {
        "kind": "throughput",
        "num_requests": len(prompts),
        "elapsed_time": elapsed,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "requests_per_second": len(prompts) / elapsed,
        "tokens_per_second": (input_tokens + output_tokens) / elapsed,
        "output_tokens_per_second": output_tokens / elapsed,
    }


def run_latency(
    llm: LLM,
    requests: Sequence[SampleRequest],
    input_len: int,
    output_len: int,
    num_iters_warmup: int,
    num_iters: int,
    percentiles: Sequence[float] = (10, 25, 50, 75, 90, 99),
) -> dict[str, Any]:
    """One batch timed end to end ``num_iters`` times: mean and percentiles in seconds."""
    prompts = token_prompts(llm, requests, input_len)
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    for _ in range(num_iters_warmup):
        llm.generate(prompts, params)
    latencies = []
    for _ in range(num_iters):
        start = time.perf_counter()
        llm.generate(prompts, params)
        latencies.append(time.perf_counter() - start)
    values = np.percentile(latencies, percentiles)
    return {
        "kind": "latency",
        "batch_size": len(prompts),
        "input_len": input_len,
        "output_len": output_len,
        "avg_latency": float(np.mean(latencies)),
        "latencies": latencies,
        "percentiles": {str(q): float(v) for q, v in zip(percentiles, values, strict=True)},
    }
