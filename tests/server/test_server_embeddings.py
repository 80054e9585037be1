"""``/v1/embeddings`` and the Databricks embeddings task in-process, on the default embedding
model (all-MiniLM-L6-v2), checked against the embedding engine itself; the rejections; and a
generation server refusing embeddings (and the other way round)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from server_harness import ROUTE_PATHS, Server

from ferrollm.engine.embed import Embedder
from ferrollm.engine.embed_async import AsyncEmbedder
from ferrollm.server.app import App
from ferrollm.server.context import ServerContext
from ferrollm.server_config import ServerConfig

MODEL = "minilm"
DBX = f"/serving-endpoints/{MODEL}/invocations"


class EmbedServer:
    """An embedding app on its own event-loop thread."""

    def __init__(self) -> None:
        embedder = Embedder.from_path(device="cpu", dtype="float32", max_num_batched_tokens=512)
        self.engine = AsyncEmbedder(embedder, max_num_waiting=64)
        self.ctx = ServerContext.build(self.engine, ServerConfig(served_model_name=MODEL))
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        transport = httpx.ASGITransport(app=App(ctx=self.ctx))
        self.client = httpx.AsyncClient(transport=transport, base_url="http://t")

    def post(self, path: str, body: Any) -> httpx.Response:
        request = self.client.post(path, content=json.dumps(body).encode())
        return asyncio.run_coroutine_threadsafe(request, self.loop).result(60)

    def get(self, path: str) -> httpx.Response:
        return asyncio.run_coroutine_threadsafe(self.client.get(path), self.loop).result(60)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.client.aclose(), self.loop).result(10)
        self.engine.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def emb() -> Iterator[EmbedServer]:
    server = EmbedServer()
    yield server
    server.close()


def expected(emb: EmbedServer, texts: list[str]) -> np.ndarray:
    e = emb.engine.embedder
    return e.embed(e.encode(texts))


TEXTS = ["The cat sits on the mat.", "向量检索", "a " * 100]


def test_openai_float_and_base64(emb: EmbedServer) -> None:
    want = expected(emb, TEXTS)
    floats = emb.post("/v1/embeddings", {"model": MODEL, "input": TEXTS})
    assert floats.status_code == 200, floats.text
    body = floats.json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(d["object"] == "embedding" for d in body["data"])
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, want, atol=1e-5)
    num_tokens = sum(len(i) for i in emb.engine.embedder.encode(TEXTS))
    assert body["usage"] == {"prompt_tokens": num_tokens, "total_tokens": num_tokens}
    b64 = emb.post("/v1/embeddings", {"model": MODEL, "input": TEXTS, "encoding_format": "base64"})
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in b64.json()["data"]]
    np.testing.assert_allclose(np.array(decoded), got, atol=1e-6)


def test_one_string_and_token_ids(emb: EmbedServer) -> None:
    ids = emb.engine.embedder.encode(TEXTS[:2])
    one = emb.post("/v1/embeddings", {"model": MODEL, "input": TEXTS[0], "dimensions": 384})
    as_ids = emb.post("/v1/embeddings", {"model": MODEL, "input": ids[0]})
    as_lists = emb.post("/v1/embeddings", {"model": MODEL, "input": ids})
    want = expected(emb, TEXTS[:2])
    for response, rows in ((one, 1), (as_ids, 1), (as_lists, 2)):
        assert response.status_code == 200, response.text
        got = np.array([d["embedding"] for d in response.json()["data"]])
        np.testing.assert_allclose(got, want[:rows], atol=1e-5)
    assert as_ids.json()["usage"]["prompt_tokens"] == len(ids[0])


def test_truncation_on_request(emb: EmbedServer) -> None:
    long = "word " * 400
    refused = emb.post("/v1/embeddings", {"model": MODEL, "input": ["ok", long]})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "input[1]" and "402 tokens" in error["message"]
    assert "at most 256" in error["message"] and "truncate_prompt_tokens" in error["message"]
    e = emb.engine.embedder
    for k, length in ((-1, 256), (10, 10)):
        body = {"model": MODEL, "input": [long], "truncate_prompt_tokens": k}
        response = emb.post("/v1/embeddings", body)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["prompt_tokens"] == length
        want = e.embed([e.tokenizer.truncate(e.encode([long])[0], length)])
        np.testing.assert_allclose(response.json()["data"][0]["embedding"], want[0], atol=1e-5)


def test_databricks_body_with_instruction(emb: EmbedServer) -> None:
    instruction = "Represent this sentence for searching relevant passages:"
    body = {"input": ["first chunk", "second chunk"], "instruction": instruction}
    response = emb.post(DBX, body)
    assert response.status_code == 200, response.text
    got = response.json()
    assert set(got) == {"id", "object", "model", "data", "usage"}
    assert got["object"] == "list" and got["model"] == MODEL
    joined = [f"{instruction} first chunk", f"{instruction} second chunk"]
    want = expected(emb, joined)
    np.testing.assert_allclose([d["embedding"] for d in got["data"]], want, atol=1e-5)
    num_tokens = sum(len(i) for i in emb.engine.embedder.encode(joined))
    assert got["usage"] == {"prompt_tokens": num_tokens, "total_tokens": num_tokens}
    single = emb.post(DBX, {"input": "first chunk"}).json()
    np.testing.assert_allclose(
        single["data"][0]["embedding"], expected(emb, ["first chunk"])[0], atol=1e-5
    )


OPENAI_BAD: dict[str, tuple[dict[str, Any], str, str]] = {
    "no-model": ({"input": "a"}, "model", "required"),
    "wrong-model": ({"model": "other", "input": "a"}, "model", "does not exist"),
    "no-input": ({"model": MODEL}, "input", "non-empty string"),
    "empty-list": ({"model": MODEL, "input": []}, "input", "an empty list"),
    "empty-string": ({"model": MODEL, "input": ["a", ""]}, "input[1]", "must not be empty"),
    "mixed": ({"model": MODEL, "input": ["a", 5]}, "input[1]", "mixing"),
    "bad-id": ({"model": MODEL, "input": [1, 99999]}, "input[1]", "token id in [0, 30521]"),
    "empty-ids": ({"model": MODEL, "input": [[1], []]}, "input[1]", "must not be empty"),
    "format": ({"model": MODEL, "input": "a", "encoding_format": "int8"}, "encoding_format", ""),
    "dimensions": ({"model": MODEL, "input": "a", "dimensions": 128}, "dimensions", "Matryoshka"),
    "dimensions-0": ({"model": MODEL, "input": "a", "dimensions": 0}, "dimensions", "positive"),
    "truncate-0": ({"model": MODEL, "input": "a", "truncate_prompt_tokens": 0},
                   "truncate_prompt_tokens", "positive"),
    "truncate-big": ({"model": MODEL, "input": "a", "truncate_prompt_tokens": 257},
                     "truncate_prompt_tokens", "at most 256"),
    "unknown": ({"model": MODEL, "input": "a", "pooling": "cls"}, "pooling", "unknown field"),
    "too-many": ({"model": MODEL, "input": ["a"] * 2049}, "input", "at most 2048"),
    "total-tokens": ({"model": MODEL, "input": [[5] * 200] * 1501}, "input", "300000 per request"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(OPENAI_BAD))
def test_openai_rejections(emb: EmbedServer, case: str) -> None:
    body, param, mention = OPENAI_BAD[case]
    response = emb.post("/v1/embeddings", body)
    error = response.json()["error"]
    assert response.status_code == (404 if case == "wrong-model" else 400), response.text
    assert error["param"] == param and mention in error["message"], error


DBX_BAD: dict[str, tuple[dict[str, Any], str]] = {
    "empty-list": ({"input": []}, "input"),
    "empty-string": ({"input": ["a", ""]}, "input"),
    "instruction-type": ({"input": "a", "instruction": 5}, "instruction"),
    "too-long": ({"input": ["word " * 300]}, "input[0]"),
}


@pytest.mark.parametrize("case", list(DBX_BAD))
def test_databricks_rejections(emb: EmbedServer, case: str) -> None:
    body, mention = DBX_BAD[case]
    response = emb.post(DBX, body)
    assert response.status_code == 400, response.text
    assert response.json()["error_code"] == "BAD_REQUEST"
    assert f"`{mention}" in response.json()["message"], response.text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}),
        ("/v1/completions", {"model": MODEL, "prompt": "x"}),
        (f"/v2/models/{MODEL}/generate", {"inputs": "x"}),
        (DBX, {"prompt": "x"}),
    ],
)
def test_embedding_server_refuses_generation(emb: EmbedServer, path: str, body: Any) -> None:
    response = emb.post(path, body)
    assert response.status_code == 400, response.text
    assert "runs the embed task" in response.text


def test_models_and_metrics_say_the_task(emb: EmbedServer) -> None:
    card = emb.get("/v1/models").json()["data"][0]
    assert (card["id"], card["task"], card["max_model_len"]) == (MODEL, "embed", 257)
    assert emb.get("/health").status_code == 200
    assert emb.get("/v2/health/ready").json() == {"ready": True}
    assert "ferrollm_engine_steps" in emb.get("/metrics").text


def test_queue_bound_is_a_503(emb: EmbedServer) -> None:
    response = emb.post("/v1/embeddings", {"model": MODEL, "input": ["a"] * 65})
    assert response.status_code == 503, response.text
    assert "queue is full" in response.json()["error"]["message"]


def test_concurrent_requests(emb: EmbedServer) -> None:
    texts = [f"sentence number {i} " * (1 + i % 7) for i in range(24)]
    want = expected(emb, texts)

    async def many() -> list[httpx.Response]:
        posts = [
            emb.client.post("/v1/embeddings", json={"model": MODEL, "input": t}) for t in texts
        ]
        return await asyncio.gather(*posts)

    responses = asyncio.run_coroutine_threadsafe(many(), emb.loop).result(60)
    got = np.array([r.json()["data"][0]["embedding"] for r in responses])
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_generation_server_refuses_embeddings(server: Server) -> None:
    response = server.post("/v1/embeddings", {"model": "tiny", "input": "a"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "input" and "--task embed" in error["message"]
    dbx = server.post(ROUTE_PATHS["databricks"], {"input": ["a"]})
    assert dbx.status_code == 400 and "does not support the embeddings task" in dbx.text


class _Fatal(BaseException):
    """What no request handling catches."""


def test_embedder_thread_death_fails_in_flight_requests_and_turns_health_503() -> None:
    embedder = Embedder.from_path(device="cpu", dtype="float32", max_num_batched_tokens=512)
    gate = threading.Event()
    run_plan = embedder.run_plan

    def dying_run_plan(plan: Any) -> np.ndarray:
        gate.wait(10)
        if 29999 in plan.input_ids:
            raise _Fatal("injected")
        return run_plan(plan)

    embedder.run_plan = dying_run_plan  # type: ignore[method-assign]
    engine = AsyncEmbedder(embedder, max_num_waiting=64)
    app = App(ctx=ServerContext.build(engine, ServerConfig(served_model_name=MODEL)))
    deaths: list[BaseException] = []

    async def go() -> list[httpx.Response]:
        engine.watch(deaths.append)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:

            def post(value: Any) -> asyncio.Future[httpx.Response]:
                body = {"model": MODEL, "input": value}
                return asyncio.ensure_future(client.post("/v1/embeddings", json=body))

            running = post([[101, 29999, 102]])
            while engine.stats()["num_running_seqs"] == 0:  # its step waits at the gate
                await asyncio.sleep(0.005)
            waiting = post(["queued behind the dying step", "and another"])
            while engine.stats()["num_waiting_seqs"] < 2:
                await asyncio.sleep(0.005)
            gate.set()
            responses = list(await asyncio.gather(running, waiting))
            while not deaths:
                await asyncio.sleep(0.005)
            responses.append(
                await client.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
            )
            responses.append(await client.get("/health"))
            responses.append(await client.get("/v2/health/ready"))
            return responses

    try:
        running, waiting, after, health, ready = asyncio.run(go())
    finally:
        engine.shutdown()
    for response in (running, waiting, after):
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "engine_dead", response.text
    assert (health.status_code, ready.status_code) == (503, 503)
    assert len(deaths) == 1 and isinstance(deaths[0], _Fatal)
    assert not engine.is_running
