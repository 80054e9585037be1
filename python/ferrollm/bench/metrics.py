"""A run's numbers from its requests' results, named as ``vllm bench serve`` names them.

Latencies are in milliseconds: TTFT (send -> first text chunk), TPOT (per request,
(E2EL - TTFT) / (output tokens - 1), for requests of more than one token), ITL (every gap
between text chunks, pooled over requests) and E2EL (send -> end of stream). Each
``--percentile-metrics`` metric gets ``mean_*_ms``, ``median_*_ms``, ``std_*_ms`` and a
``p{q}_*_ms`` per ``--metric-percentiles`` value (numpy's linear interpolation). Goodput is the
successful requests meeting every SLO per second of the run; a request meets the ``itl`` SLO
when its largest gap does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ferrollm.bench.loadgen import RequestResult

METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass(frozen=True)
class MetricOptions:
    """What a summary reports: the metrics with percentiles, the percentiles, the SLOs (ms)."""

    percentile_metrics: Sequence[str] = ("ttft", "tpot", "itl")
    percentiles: Sequence[float] = (99.0,)
    goodput: Mapping[str, float] | None = None


def summarize(
    results: Sequence[RequestResult], duration_s: float, options: MetricOptions
) -> dict[str, Any]:
    """The run's counts, throughputs, latency statistics and goodput."""
    ok = [r for r in results if r.success]
    input_tokens = sum(r.input_len for r in ok)
    output_tokens = sum(r.output_len for r in ok)
    summary: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": _per_s(len(ok), duration_s),
        "output_throughput": _per_s(output_tokens, duration_s),
        "total_token_throughput": _per_s(input_tokens + output_tokens, duration_s),
        "request_goodput": None,
    }
    if options.goodput:
        good = sum(meets_slos(r, options.goodput) for r in ok)
        summary["request_goodput"] = _per_s(good, duration_s)
    samples = latency_samples_ms(ok)
    for metric in options.percentile_metrics:
        summary.update(_stats(metric, samples[metric], options.percentiles))
    return summary


def latency_samples_ms(results: Sequence[RequestResult]) -> dict[str, np.ndarray]:
    """Each metric's samples in ms: one per request (ITL: one per gap)."""
    return {
        "ttft": np.array([r.ttft for r in results]) * 1e3,
        "tpot": np.array([tpot(r) for r in results if r.output_len > 1]) * 1e3,
        "itl": np.array([gap for r in results for gap in r.itls]) * 1e3,
        "e2el": np.array([r.e2el for r in results]) * 1e3,
    }


def tpot(result: RequestResult) -> float:
    """Seconds per output token after the first."""
    return (result.e2el - result.ttft) / (result.output_len - 1)


def meets_slos(result: RequestResult, slos_ms: Mapping[str, float]) -> bool:
    """Whether a successful request meets every SLO (milliseconds) in ``slos_ms``."""
    values = {
        "ttft": result.ttft,
        "tpot": tpot(result) if result.output_len > 1 else 0.0,
        "itl": max(result.itls, default=0.0),
        "e2el": result.e2el,
    }
    return all(values[name] * 1e3 <= limit for name, limit in slos_ms.items())


def _stats(metric: str, values: np.ndarray, percentiles: Sequence[float]) -> dict[str, float]:
    if values.size == 0:
        values = np.array([np.nan])  # no samples: every statistic is NaN (null in the JSON)
    stats = {
        f"mean_{metric}_ms": float(np.mean(values)),
        f"median_{metric}_ms": float(np.median(values)),
        f"std_{metric}_ms": float(np.std(values)),
    }
    for q, value in zip(percentiles, np.percentile(values, percentiles), strict=True):
        stats[f"p{_percentile_name(q)}_{metric}_ms"] = float(value)
    return stats


def _percentile_name(q: float) -> str:
    """``99`` for 99.0, ``99.9`` for 99.9: the key ``vllm bench`` writes."""
    return str(int(q)) if float(q).is_integer() else str(q)


def _per_s(count: float, duration_s: float) -> float:
    return count / duration_s if duration_s > 0 else 0.0
