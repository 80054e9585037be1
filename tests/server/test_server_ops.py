"""Operational routes: ``/v1/models``, health, ``/metrics`` and ``/openapi.json``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_harness import MAX_MODEL_LEN, MODEL, ROUTE_PATHS, Server

from ferrollm.server.app import ROUTES, App
from ferrollm.server.context import ServerContext
from ferrollm.server.metrics import Metrics
from ferrollm.server_config import ServerConfig


def test_models(server: Server) -> None:
    response = server.get("/v1/models")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body == {
        "object": "list",
        "data": [
            {
                "id": MODEL,
                "object": "model",
                "created": server.ctx.created,
                "owned_by": "ferrollm",
                "root": MODEL,
                "max_model_len": MAX_MODEL_LEN,
                "task": "generate",
                "parent": None,
                "modalities": ["text"],
            }
        ],
    }


@pytest.mark.parametrize(
    ("path", "body"),
    [("/health", {}), ("/v2/health/live", {}), ("/v2/health/ready", {"ready": True})],
)
def test_health(server: Server, path: str, body: dict[str, Any]) -> None:
    response = server.get(path)
    assert response.status_code == 200
    assert response.json() == body


@dataclass
class _StoppedEngine:
    """Just what the health routes read of an engine."""

    is_running: bool = False
    stalled_s: float = 0.0

    def seconds_since_progress(self) -> float:
        return self.stalled_s

    def stats(self) -> dict[str, int]:
        return {
            name: 0
            for name in (
                "num_running_seqs",
                "num_waiting_seqs",
                "num_used_blocks",
                "num_free_blocks",
                "num_cached_blocks",
                "num_prefix_queried_blocks",
                "num_prefix_hit_blocks",
                "num_preemptions",
                "num_steps",
            )
        }


def _app_over(engine: _StoppedEngine, server: Server) -> App:
    ctx = ServerContext(
        engine=engine,  # type: ignore[arg-type]
        config=ServerConfig(),
        model_name=MODEL,
        limits=server.ctx.limits,
        metrics=Metrics(MODEL, engine.stats),
    )
    return App(ctx=ctx)


def test_health_when_engine_stopped_or_stalled(server: Server) -> None:
    import httpx

    async def get(app: App, path: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get(path)

    stopped = _app_over(_StoppedEngine(is_running=False), server)
    assert server.run(get(stopped, "/health")).status_code == 503
    ready = server.run(get(stopped, "/v2/health/ready"))
    assert (ready.status_code, ready.json()) == (503, {"ready": False, "reason": "engine stopped"})
    assert server.run(get(stopped, "/v2/health/live")).status_code == 200
    stalled = _app_over(_StoppedEngine(is_running=True, stalled_s=120.0), server)
    ready = server.run(get(stalled, "/v2/health/ready"))
    assert ready.status_code == 503
    assert ready.json()["ready"] is False and "120 s" in ready.json()["reason"]
    assert server.run(get(stalled, "/health")).status_code == 200


def scrape(server: Server) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``: (name, sorted labels) -> value."""
    response = server.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    key = (name, tuple(sorted({"model_name": MODEL, **labels}.items())))
    return samples.get(key, 0.0)


SERIES = [
    "ferrollm_time_to_first_token_seconds_count",
    "ferrollm_inter_token_latency_seconds_count",
    "ferrollm_e2e_request_latency_seconds_count",
    "ferrollm_request_queue_time_seconds_count",
    "ferrollm_prompt_tokens_total",
    "ferrollm_generation_tokens_total",
    "ferrollm_num_requests_running",
    "ferrollm_num_requests_waiting",
    "ferrollm_kv_blocks_used",
    "ferrollm_kv_blocks_free",
    "ferrollm_kv_blocks_cached",
    "ferrollm_prefix_cache_hit_rate",
    "ferrollm_prefix_cache_queries_total",
    "ferrollm_prefix_cache_hits_total",
    "ferrollm_num_preemptions_total",
    "ferrollm_engine_steps_total",
]


def test_metrics_move_with_requests(server: Server) -> None:
    before = scrape(server)
    names = {name for name, _ in before}
    assert set(SERIES) <= names, set(SERIES) - names
    prompt = "The quick brown fox"
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 5, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    assert server.post(ROUTE_PATHS["completions"], body).status_code == 200
    after = scrape(server)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("ferrollm_generation_tokens_total") == 5
    assert delta("ferrollm_prompt_tokens_total") == len(server.tokenizer.encode(prompt))
    assert delta("ferrollm_request_success_total", finished_reason="length") == 1
    assert delta("ferrollm_time_to_first_token_seconds_count") == 1
    assert delta("ferrollm_inter_token_latency_seconds_count") == 4
    assert delta("ferrollm_e2e_request_latency_seconds_count") == 1
    assert delta("ferrollm_request_queue_time_seconds_count") == 1
    assert delta("ferrollm_engine_steps_total") >= 5
    assert delta("ferrollm_prefix_cache_queries_total") >= 0
    assert value(after, "ferrollm_num_requests_running") == 0
    assert value(after, "ferrollm_kv_blocks_used") == 0
    assert value(after, "ferrollm_kv_blocks_free") > 0


def test_openapi(server: Server) -> None:
    response = server.get("/openapi.json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    doc = json.loads(response.content)
    assert doc["openapi"].startswith("3.1")
    assert doc["info"]["title"] == "ferrollm"
    for route in ROUTES:
        assert route.method.lower() in doc["paths"][route.path], route.path
    schemas = doc["components"]["schemas"]
    for name in [
        "ChatCompletionRequest",
        "CompletionRequest",
        "GenerateRequest",
        "GenerateParameters",
        "DatabricksChatRequest",
        "DatabricksCompletionRequest",
        "DatabricksEmbeddingRequest",
        "ChatCompletion",
        "Completion",
        "GenerateResponse",
        "GenerateStreamFrame",
        "ModelList",
        "OpenAIErrorBody",
        "MindIEErrorBody",
        "DatabricksErrorBody",
    ]:
        assert name in schemas, name
    assert {"model", "messages"} <= set(schemas["ChatCompletionRequest"]["required"])
    assert schemas["GenerateRequest"]["required"] == ["text_input"]
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ChatCompletionRequest"
    }
    stream = doc["paths"]["/v2/models/{model}/generate_stream"]["post"]
    assert set(stream["responses"]["200"]["content"]) == {"text/event-stream"}
    # A route that may stream documents both bodies: an SSE event's data is JSON of the chunk.
    ok = chat["responses"]["200"]["content"]
    assert set(ok) == {"application/json", "text/event-stream"}
    data = ok["text/event-stream"]["schema"]["properties"]["data"]["anyOf"]
    assert data[0] == {"const": "[DONE]"} and data[1]["contentMediaType"] == "application/json"
    assert data[1]["contentSchema"]["title"] == "ChatCompletionChunk"
    # Path parameters are declared; 503 (with Retry-After) and 504 are documented.
    for route in ROUTES:
        operation = doc["paths"][route.path][route.method.lower()]
        names = [p["name"] for p in operation.get("parameters", []) if p["in"] == "path"]
        assert names == re.findall(r"\{(\w+)\}", route.path), route.path
        assert "Retry-After" in operation["responses"]["503"]["headers"]
        assert ("504" in operation["responses"]) == (route.request is not None), route.path
    # Every reference resolves.
    refs = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                refs.add(node["$ref"])
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(doc)
    assert refs
    for ref in refs:
        assert ref.startswith("#/components/schemas/")
        assert ref.removeprefix("#/components/schemas/") in schemas, ref
    # A POST to it is refused (405), not routed.
    assert server.post("/openapi.json", {}).status_code in (404, 405)
