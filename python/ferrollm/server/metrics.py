"""Prometheus metrics (``GET /metrics``) via prometheus-client, in a registry per app.

Request-level series (latencies, token counters) are observed by the server as requests run;
engine-level series (queues, KV blocks, prefix cache, preemptions) are read at scrape time
from the scheduler's counters as of the latest step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

#: The exposition format's content type.
CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

#: The ``reason`` label of ``ferrollm_requests_rejected_total`` by ApiError code (or status).
REJECT_REASONS = {
    "overloaded": "overloaded",
    "shutting_down": "shutting_down",
    "too_many_requests": "per_key_limit",
    "invalid_api_key": "unauthorized",
    "timeout": "deadline",
    "body_too_large": "body_too_large",
    "401": "unauthorized",
    "429": "per_key_limit",
    "504": "deadline",
}

_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
)  # fmt: skip


class Metrics:
    """The server's metrics; ``engine_stats`` returns ``Scheduler.stats()``-shaped counters."""

    def __init__(self, model_name: str, engine_stats: Callable[[], dict[str, int]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        labels = ["model_name"]

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(
                name, doc, labels, buckets=_LATENCY_BUCKETS, registry=self.registry
            ).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=self.registry).labels(model_name)

        self.time_to_first_token = histogram(
            "ferrollm_time_to_first_token_seconds", "Time from arrival to the first token."
        )
        self.inter_token_latency = histogram(
            "ferrollm_inter_token_latency_seconds", "Time between consecutive tokens."
        )
        self.e2e_request_latency = histogram(
            "ferrollm_e2e_request_latency_seconds", "Time from arrival to the last token."
        )
        self.request_queue_time = histogram(
            "ferrollm_request_queue_time_seconds", "Time from arrival to first scheduling."
        )
        self.prompt_tokens = counter(
            "ferrollm_prompt_tokens", "Prompt tokens of finished requests."
        )
        self.generation_tokens = counter("ferrollm_generation_tokens", "Generated tokens.")
        self._finished = Counter(
            "ferrollm_request_success",
            "Requests that ran to the end, by finish reason.",
            [*labels, "finished_reason"],
            registry=self.registry,
        )
        self.registry.register(_EngineCollector(model_name, engine_stats))
        self._rejected = Counter(
            "ferrollm_requests_rejected",
            "Requests answered with an error before any response began, by reason: "
            + ", ".join(REJECT_REASONS.values())
            + ", invalid (any other 4xx) or error (any other 5xx).",
            [*labels, "reason"],
            registry=self.registry,
        )
        for reason in {*REJECT_REASONS.values(), "invalid", "error"}:  # every series from 0
            self._rejected.labels(model_name, reason)

    def watch_admission(self, admission: Callable[[], dict[str, int]]) -> None:
        """Expose the admission state ``admission()`` returns (waiting requests and prompt
        tokens, requests in flight) as gauges read at scrape time."""
        self.registry.register(_AdmissionCollector(self.model_name, admission))

    def request_rejected(self, status: int, code: str | None) -> None:
        """Count a request refused with ``status`` (the ApiError's ``code``)."""
        reason = REJECT_REASONS.get(code or "", REJECT_REASONS.get(str(status), "invalid"))
        if status >= 500 and reason == "invalid":
            reason = "error"
        self._rejected.labels(self.model_name, reason).inc()

    def request_finished(self, reason: str) -> None:
        """Count a request that ended with ``reason`` ("stop", "length", "timeout", ...)."""
        self._finished.labels(self.model_name, reason).inc()

    def render(self) -> bytes:
        """The exposition text."""
        return generate_latest(self.registry)


class _AdmissionCollector(Collector):
    def __init__(self, model_name: str, state: Callable[[], dict[str, int]]) -> None:
        self._model_name = model_name
        self._state = state

    def collect(self) -> Iterator[Metric]:
        s = self._state()
        docs = {
            "ferrollm_admission_waiting_requests": (
                "num_waiting",
                "Admitted requests not yet past their first step (max_waiting_requests).",
            ),
            "ferrollm_admission_waiting_prompt_tokens": (
                "num_waiting_tokens",
                "Prompt tokens of those requests (max_waiting_tokens).",
            ),
            "ferrollm_requests_in_flight": (
                "num_in_flight",
                "Requests past the keys and the drain check, not yet answered.",
            ),
        }
        for name, (key, doc) in docs.items():
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self._model_name], s[key])
            yield family


class _EngineCollector(Collector):
    def __init__(self, model_name: str, stats: Callable[[], dict[str, int]]) -> None:
        self._model_name = model_name
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        labels = [self._model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(labels, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(labels, value)
            return family

        queried = s["num_prefix_queried_blocks"]
        hit_rate = s["num_prefix_hit_blocks"] / queried if queried else 0.0
        yield gauge("ferrollm_num_requests_running", "Sequences running.", s["num_running_seqs"])
        yield gauge("ferrollm_num_requests_waiting", "Sequences waiting.", s["num_waiting_seqs"])
        yield gauge("ferrollm_kv_blocks_used", "KV-cache blocks in use.", s["num_used_blocks"])
        yield gauge("ferrollm_kv_blocks_free", "KV-cache blocks free.", s["num_free_blocks"])
        yield gauge(
            "ferrollm_kv_blocks_cached",
            "Free KV blocks kept for prefix reuse.",
            s["num_cached_blocks"],
        )
        yield gauge(
            "ferrollm_prefix_cache_hit_rate", "Prefix-cache block hits / lookups.", hit_rate
        )
        yield counter(
            "ferrollm_prefix_cache_queries", "Blocks looked up in the prefix cache.", queried
        )
        yield counter(
            "ferrollm_prefix_cache_hits",
            "Blocks found in the prefix cache.",
            s["num_prefix_hit_blocks"],
        )
        yield counter("ferrollm_num_preemptions", "Sequences preempted.", s["num_preemptions"])
        yield counter("ferrollm_engine_steps", "Engine steps run.", s["num_steps"])
        if "encoder_cache_hits" in s:  # a media model's (``EncoderCache.stats``)
            yield counter(
                "ferrollm_encoder_cache_hits",
                "Media items whose encoder output came from the cache.",
                s["encoder_cache_hits"],
            )
            yield counter(
                "ferrollm_encoder_cache_misses",
                "Media items run through the encoder.",
                s["encoder_cache_misses"],
            )
            yield gauge(
                "ferrollm_encoder_cache_entries",
                "Encoder outputs held.",
                s["encoder_cache_entries"],
            )
            yield gauge(
                "ferrollm_encoder_cache_bytes",
                "Bytes of encoder outputs held (encoder_cache_memory at most).",
                s["encoder_cache_bytes"],
            )
