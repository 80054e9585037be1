"""``ferrollm bench serve``: one run per ``--max-concurrency`` level, then the result file.

A run sends its own prompts (a sweep's levels never share one, unless the dataset is a file),
after ``num_warmups`` requests whose results are dropped. Each level prints a block of numbers
and one line (``serve label=... conc=... errors=N``) that benches/serve.py's users grep; the
result document (`result_document`) holds every level's summary and its per-request samples,
which `ferrollm.bench.plots` draws.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ferrollm.bench.datasets import (
    MEASURED,
    WARMUP,
    SampleRequest,
    jsonl_requests,
    random_requests,
)
from ferrollm.bench.loadgen import (
    ClientConfig,
    Progress,
    arrival_times,
    first_model_id,
    new_client,
    run_requests,
    send_request,
)
from ferrollm.bench.metrics import MetricOptions, summarize

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class DatasetConfig:
    """Where the prompts come from (``--dataset-*`` and ``--random-*``)."""

    name: str = "random"
    path: str | None = None
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0

    def requests(self, num: int, seed: int, first_index: int, stream: int) -> list[SampleRequest]:
        """``num`` prompts (a file gives its first ``num`` lines to every level)."""
        if self.name == "jsonl":
            assert self.path is not None  # the CLI requires it
            return jsonl_requests(Path(self.path), num, self.random_output_len)
        lengths = (self.random_input_len, self.random_output_len, self.random_range_ratio)
        return random_requests(num, *lengths, seed, first_index, stream)


@dataclass(frozen=True)
class ServeConfig:
    """Everything a ``bench serve`` invocation asks for."""

    client: ClientConfig
    dataset: DatasetConfig
    num_prompts: int = 1000
    max_concurrency: Sequence[int | None] = (None,)
    request_rate: float = math.inf
    seed: int = 0
    num_warmups: int = 0
    metrics: MetricOptions = field(default_factory=MetricOptions)
    label: str = "server"


async def run_serve(config: ServeConfig, quiet: bool = False) -> dict[str, Any]:
    """Warm up, run each concurrency level, and return the result document."""
    warmups = config.dataset.requests(config.num_warmups, config.seed, 0, WARMUP)
    async with new_client(config.client, 1) as client:
        for request in warmups:  # one at a time: the server's first compiles, not a load
            await send_request(client, config.client, request)
    runs = []
    for level, concurrency in enumerate(config.max_concurrency):
        runs.append(await run_level(config, concurrency, level * config.num_prompts, quiet))
    return result_document(config, runs)


async def run_level(
    config: ServeConfig, concurrency: int | None, first_index: int, quiet: bool = False
) -> dict[str, Any]:
    """One level: its summary, then its per-request samples."""
    requests = config.dataset.requests(config.num_prompts, config.seed, first_index, MEASURED)
    arrivals = arrival_times(len(requests), config.request_rate, config.seed)
    progress = None if quiet else Progress(len(requests), f"conc={_conc(concurrency)}")
    results, duration = await run_requests(config.client, requests, concurrency, arrivals, progress)
    run: dict[str, Any] = {
        "max_concurrency": concurrency,
        "request_rate": _rate(config.request_rate),
        "num_prompts": len(requests),
        **summarize(results, duration, config.metrics),
        "input_lens": [r.input_len for r in results],
        "output_lens": [r.output_len for r in results],
        "ttfts_ms": [r.ttft * 1e3 if r.success else None for r in results],
        "itls_ms": [[gap * 1e3 for gap in r.itls] for r in results],
        "e2els_ms": [r.e2el * 1e3 if r.success else None for r in results],
        "errors": [r.error for r in results],
    }
    print_level(config, run)
    return run


def result_document(config: ServeConfig, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON result: what was run (the flags' values), then one entry per level."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "serve",
        "label": config.label,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "base_url": config.client.base_url,
        "endpoint": config.client.endpoint,
        "model": config.client.model,
        "dataset": asdict(config.dataset),
        "num_prompts": config.num_prompts,
        "request_rate": _rate(config.request_rate),
        "seed": config.seed,
        "num_warmups": config.num_warmups,
        "ignore_eos": config.client.ignore_eos,
        "temperature": config.client.temperature,
        "percentile_metrics": list(config.metrics.percentile_metrics),
        "metric_percentiles": list(config.metrics.percentiles),
        "goodput_slos_ms": dict(config.metrics.goodput or {}) or None,
        "runs": runs,
    }


def print_level(config: ServeConfig, run: dict[str, Any]) -> None:
    """The level's numbers, then its one-line summary."""
    keys = [
        ("completed", "Successful requests"),
        ("failed", "Failed requests"),
        ("duration", "Benchmark duration (s)"),
        ("request_throughput", "Request throughput (req/s)"),
        ("request_goodput", "Request goodput (req/s)"),
        ("output_throughput", "Output token throughput (tok/s)"),
        ("total_token_throughput", "Total token throughput (tok/s)"),
    ]
    keys += [(k, _title(k)) for k in run if k.endswith("_ms") and not isinstance(run[k], list)]
    title = f" {config.label} max_concurrency={_conc(run['max_concurrency'])} "
    print(f"{title:=^56}")
    for key, title in keys:
        value = run[key]
        if value is not None:
            print(
                f"{title:<40}{value:>16.2f}"
                if isinstance(value, float)
                else f"{title:<40}{value:>16}"
            )
    p50 = (run.get("median_ttft_ms"), run.get("median_itl_ms"))
    print(
        f"serve label={config.label} conc={_conc(run['max_concurrency'])} "
        f"requests={run['num_prompts']} out_tok/s={run['output_throughput']:.1f} "
        f"ttft_p50={_ms(p50[0])} itl_p50={_ms(p50[1])} errors={run['failed']}",
        flush=True,
    )


def write_result(document: dict[str, Any], path: Path) -> Path:
    """Write the document as JSON (NaN and inf as null and "inf"); the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_jsonable(document), indent=2) + "\n", encoding="utf-8")
    return path


def load_result(path: Path) -> dict[str, Any]:
    """A result file written by `write_result`."""
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return document


def default_filename(document: dict[str, Any]) -> str:
    """``{label}-{model}-{UTC date and time}.json``, the model's path reduced to its name."""
    model = Path(str(document["model"])).name.replace(" ", "_")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"{document['label']}-{model}-{stamp}.json"


async def resolve_model(base_url: str, model: str | None) -> str:
    """``model``, or the first model the server lists."""
    return model if model is not None else await first_model_id(base_url)


def _title(key: str) -> str:
    """``Mean TTFT (ms)`` for ``mean_ttft_ms``."""
    stat, metric, _ = key.split("_")
    return f"{stat.capitalize()} {metric.upper()} (ms)"


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else "inf"
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _rate(request_rate: float) -> float | str:
    return "inf" if math.isinf(request_rate) else request_rate


def _conc(concurrency: int | None) -> str:
    return "inf" if concurrency is None else str(concurrency)


def _ms(value: float | None) -> str:
    return "nan" if value is None or math.isnan(value) else f"{value:.1f}ms"
