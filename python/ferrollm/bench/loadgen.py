"""The load generator: streaming requests to an OpenAI-compatible server, timed per chunk.

Each request streams (``stream_options.include_usage``); a chunk whose choice carries text
(``text`` on /v1/completions; ``delta.content`` or the reasoning delta on
/v1/chat/completions) is a token arrival: TTFT is send -> first such chunk, ITLs the gaps
between them, E2EL send -> end of stream. Output tokens are the final ``usage`` chunk's
``completion_tokens``, else the number of text chunks; input tokens ``usage.prompt_tokens``,
else the prompt's word count. Requests start at Poisson arrival times (``request_rate`` per
second, seeded; all at once when it is inf) and at most ``max_concurrency`` are in flight.
A failed request is recorded with its error and never stops the run.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx
import numpy as np

from ferrollm.bench.datasets import SampleRequest

CHAT_ENDPOINT = "/v1/chat/completions"
COMPLETIONS_ENDPOINT = "/v1/completions"


@dataclass(frozen=True)
class ClientConfig:
    """What every request of a run shares."""

    base_url: str
    model: str
    endpoint: str = COMPLETIONS_ENDPOINT
    ignore_eos: bool = False
    temperature: float = 0.0
    timeout_s: float = 900.0


@dataclass
class RequestResult:
    """One request's timings (seconds from its send) and token counts; ``error`` if it failed."""

    success: bool = False
    ttft: float = 0.0
    e2el: float = 0.0
    itls: list[float] = field(default_factory=list)
    input_len: int = 0
    output_len: int = 0
    error: str = ""


def arrival_times(num: int, request_rate: float, seed: int) -> np.ndarray:
    """Send times (seconds from the start) of ``num`` requests: a Poisson process of
    ``request_rate`` per second (exponential gaps, the first request at 0), or all zeros when
    the rate is inf."""
    if math.isinf(request_rate):
        return np.zeros(num)
    gaps = np.random.default_rng(seed).exponential(1.0 / request_rate, size=num)
    return np.concatenate(([0.0], np.cumsum(gaps[:-1]))) if num else gaps


def request_body(config: ClientConfig, request: SampleRequest) -> dict[str, Any]:
    """The streaming body of one request on ``config.endpoint``."""
    body: dict[str, Any] = {
        "model": config.model,
        "max_tokens": request.output_len,
        "temperature": config.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if config.endpoint == CHAT_ENDPOINT:
        body["messages"] = [{"role": "user", "content": request.prompt}]
    else:
        body["prompt"] = request.prompt
    if config.ignore_eos:
        body["ignore_eos"] = True
    return body


async def send_request(
    client: httpx.AsyncClient, config: ClientConfig, request: SampleRequest
) -> RequestResult:
    """Send one request and time its stream; any failure is a result with ``error``."""
    result = RequestResult(input_len=request.prompt_len)
    start = time.perf_counter()
    try:
        times, usage = await _stream(client, config, request_body(config, request))
    except Exception as e:  # any failure is the request's, never the run's
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.e2el = time.perf_counter() - start
    if not times:
        result.error = "the stream carried no text"
        return result
    result.success = True
    result.ttft = times[0] - start
    result.itls = np.diff(times).tolist()
    result.output_len = int(usage.get("completion_tokens") or len(times))
    result.input_len = int(usage.get("prompt_tokens") or request.prompt_len)
    return result


async def _stream(
    client: httpx.AsyncClient, config: ClientConfig, body: dict[str, Any]
) -> tuple[list[float], dict[str, Any]]:
    """The arrival times of the text chunks, and the last ``usage`` seen."""
    times: list[float] = []
    usage: dict[str, Any] = {}
    async with client.stream("POST", config.endpoint, json=body) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            raise RuntimeError(f"HTTP {response.status_code}: {text[:300]}")
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            usage = chunk.get("usage") or usage
            if any(_has_text(choice) for choice in chunk.get("choices") or ()):
                times.append(time.perf_counter())
    return times, usage


def _has_text(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta") or {}
    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
    return bool(choice.get("text") or delta.get("content") or reasoning)


async def run_requests(
    config: ClientConfig,
    requests: Sequence[SampleRequest],
    max_concurrency: int | None,
    arrivals: np.ndarray,
    progress: Progress | None = None,
) -> tuple[list[RequestResult], float]:
    """Send ``requests`` at ``arrivals`` with at most ``max_concurrency`` in flight; the
    results in request order and the wall time from the start to the last finish."""
    limit = max_concurrency or len(requests)
    gate = asyncio.Semaphore(limit)
    async with new_client(config, limit) as client:
        start = time.perf_counter()

        async def one(request: SampleRequest, at: float) -> RequestResult:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            async with gate:
                result = await send_request(client, config, request)
            if progress is not None:
                progress.advance(result)
            return result

        tasks = [one(r, float(t)) for r, t in zip(requests, arrivals, strict=True)]
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start


def new_client(config: ClientConfig, num_connections: int) -> httpx.AsyncClient:
    """A client with a connection per request in flight."""
    limits = httpx.Limits(
        max_connections=num_connections + 4, max_keepalive_connections=num_connections + 4
    )
    return httpx.AsyncClient(
        base_url=config.base_url, limits=limits, timeout=httpx.Timeout(config.timeout_s)
    )


async def first_model_id(base_url: str) -> str:
    """The first model ``GET /v1/models`` lists."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30.0) as client:
        response = await client.get("/v1/models")
        response.raise_for_status()
        model: str = response.json()["data"][0]["id"]
        return model


class Progress:
    """Requests done out of ``total``: a redrawn bar on a terminal, else a line per tenth."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None) -> None:
        self.total, self.label, self.done, self.failed = total, label, 0, 0
        self.stream = sys.stderr if stream is None else stream
        self.tty = self.stream.isatty()
        self.start = time.perf_counter()

    def advance(self, result: RequestResult) -> None:
        self.done += 1
        self.failed += not result.success
        if self.tty:
            filled = 30 * self.done // max(self.total, 1)
            bar = "#" * filled + "." * (30 - filled)
            end = "\n" if self.done == self.total else ""
            self.stream.write(f"\r{self.label} [{bar}] {self._counts()}{end}")
        elif self.done == self.total or self.done % max(self.total // 10, 1) == 0:
            self.stream.write(f"{self.label}: {self._counts()}\n")
        self.stream.flush()

    def _counts(self) -> str:
        elapsed = time.perf_counter() - self.start
        return f"{self.done}/{self.total} requests, {self.failed} failed, {elapsed:.1f} s"
