"""Health, ``/metrics``, ``/openapi.json`` and rejections over the wire (400 naming the field,
413 for a body over the limit), each followed by a request that still works."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .e2e_support import MODEL, Server

#: Series the server exports (docs/serving.md#health-and-metrics: running/waiting, KV blocks, prefix
#: cache, preemptions, token counters, TTFT, inter-token, end-to-end and queue-time histograms).
SERIES = {
    "ferrollm_num_requests_running": "gauge",
    "ferrollm_num_requests_waiting": "gauge",
    "ferrollm_kv_blocks_used": "gauge",
    "ferrollm_kv_blocks_free": "gauge",
    "ferrollm_kv_blocks_cached": "gauge",
    "ferrollm_prefix_cache_hit_rate": "gauge",
    "ferrollm_prefix_cache_queries": "counter",
    "ferrollm_prefix_cache_hits": "counter",
    "ferrollm_num_preemptions": "counter",
    "ferrollm_engine_steps": "counter",
    "ferrollm_prompt_tokens": "counter",
    "ferrollm_generation_tokens": "counter",
    "ferrollm_request_success": "counter",
    "ferrollm_time_to_first_token_seconds": "histogram",
    "ferrollm_inter_token_latency_seconds": "histogram",
    "ferrollm_e2e_request_latency_seconds": "histogram",
    "ferrollm_request_queue_time_seconds": "histogram",
}
BODY_LIMIT = 16 * 1024 * 1024


def completion(
    server: Server, client: httpx.Client | None = None, **fields: object
) -> httpx.Response:
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2, "temperature": 0, **fields}
    return (client or server.http).post("/v1/completions", json=body)


def test_health_routes(server: Server) -> None:
    for path in ("/health", "/v2/health/live", "/v2/health/ready"):
        response = server.http.get(path)
        assert response.status_code == 200, (path, response.text)
        assert response.headers["content-type"] == "application/json"
    assert server.http.get("/v2/health/ready").json() == {"ready": True}


def test_metrics_are_prometheus_text_and_count_requests(server: Server) -> None:
    before = server.metrics()
    response = completion(server, max_tokens=5, ignore_eos=True)
    assert response.status_code == 200, response.text
    num_prompt = response.json()["usage"]["prompt_tokens"]

    scrape = server.http.get("/metrics")
    assert scrape.status_code == 200
    assert scrape.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(scrape.text)}
    for name, kind in SERIES.items():
        assert name in families, f"{name} is missing"
        assert families[name].type == kind, (name, families[name].type)
        assert all(s.labels.get("model_name") == MODEL for s in families[name].samples)
    after = server.metrics()
    assert (
        after["ferrollm_generation_tokens_total"] - before["ferrollm_generation_tokens_total"] == 5
    )
    assert (
        after["ferrollm_prompt_tokens_total"] - before["ferrollm_prompt_tokens_total"] == num_prompt
    )
    success = {
        s.labels["finished_reason"]: s.value
        for s in families["ferrollm_request_success"].samples
        if s.name == "ferrollm_request_success_total"
    }
    assert success.get("length", 0) >= 1
    assert after["ferrollm_e2e_request_latency_seconds_count"] >= 1
    assert after["ferrollm_num_requests_running"] == 0
    assert after["ferrollm_kv_blocks_used"] == 0
    assert after["ferrollm_kv_blocks_free"] > 0


def test_openapi_document(server: Server) -> None:
    response = server.http.get("/openapi.json")
    assert response.status_code == 200
    doc = response.json()
    assert doc["openapi"].startswith("3.")
    paths = doc["paths"]
    for path, method in [
        ("/v1/chat/completions", "post"),
        ("/v1/completions", "post"),
        ("/v1/models", "get"),
        ("/v2/models/{model}/generate", "post"),
        ("/v2/models/{model}/generate_stream", "post"),
        ("/serving-endpoints/{name}/invocations", "post"),
        ("/health", "get"),
        ("/v2/health/live", "get"),
        ("/v2/health/ready", "get"),
        ("/metrics", "get"),
    ]:
        assert method in paths.get(path, {}), f"{method.upper()} {path} is not documented"
    schemas = doc["components"]["schemas"]
    ref = paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert ref["schema"]["$ref"].rsplit("/", 1)[1] in schemas


def test_bad_requests_name_the_field_then_serving_goes_on(server: Server) -> None:
    cases = [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"stop": ["a", ""]}, "stop[1]"),
        ({"n": "two"}, "n"),
    ]
    for fields, param in cases:
        response = completion(server, **fields)
        assert response.status_code == 400, (fields, response.text)
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["param"] == param, (fields, error)
        assert error["type"] == "invalid_request_error"
    malformed = server.http.post(
        "/v1/completions", content=b'{"prompt": ', headers={"content-type": "application/json"}
    )
    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "invalid_json"
    assert completion(server).status_code == 200


def test_a_17_mib_body_is_refused_with_413_then_serving_goes_on(server: Server) -> None:
    big = b'{"prompt": "' + b"x" * (17 * 1024 * 1024) + b'"}'
    headers = {"content-type": "application/json"}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        response = client.post("/v1/completions", content=big, headers=headers)
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "body_too_large"
        assert str(BODY_LIMIT) in response.json()["error"]["message"]
        assert completion(server, client).status_code == 200

        # Without a content-length (chunked), the limit is found while reading; the rest of
        # the body stays unread, so the connection must not be reused.
        def chunks() -> object:
            for _ in range(17):
                yield b"x" * (1024 * 1024)

        response = client.post("/v1/completions", content=chunks(), headers=headers)
        assert response.status_code == 413
        assert response.headers.get("connection") == "close"
        # The next big body, on the same client, gets its 413 (not a dead connection).
        for _ in range(3):
            assert client.post("/v1/completions", content=big, headers=headers).status_code == 413
            assert (
                client.post("/v1/completions", content=chunks(), headers=headers).status_code == 413
            )
        assert completion(server, client).status_code == 200
    # The 413 path exists per API too.
    response = server.http.post(f"/v2/models/{MODEL}/generate", content=big, headers=headers)
    assert response.status_code == 413 and set(response.json()) == {"error", "error_type"}
