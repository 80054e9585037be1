"""``ferrollm serve --task embed`` (the default embedding model, all-MiniLM-L6-v2) as a real
process, driven by the official ``openai`` SDK and plain HTTP, against the offline engine."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from ferrollm.engine.embed import Embedder

from .e2e_support import _EXEC_WITH_PARENT_DEATH_SIGNAL, Server, _live, free_port

MODEL = "minilm"
TEXTS = ["The weather is lovely today.", "今天天气很好。", "Packing inputs without padding " * 9]


def _launch(log_path: Path, env: dict[str, str] | None = None) -> Server:
    """``ferrollm serve --task embed`` (the default embedding model) on a free port."""
    port = free_port()
    flags = ["--task", "embed", "--served-model-name", MODEL, "--dtype", "float32"]
    command = [sys.executable, "-m", "ferrollm", "serve", "--port", str(port), *flags]
    stub = [sys.executable, "-c", _EXEC_WITH_PARENT_DEATH_SIGNAL, str(os.getpid())]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*stub, *command],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    server = Server(f"http://127.0.0.1:{port}", process, log_path)
    _live.append(server)
    return server


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = _launch(tmp_path_factory.mktemp("embed") / "server.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
    log = server.log()
    assert "Traceback" not in log, log
    assert "task embed: 384 dimensions, mean pooling, normalized" in log, log


@pytest.fixture(scope="module")
def expected() -> np.ndarray:
    e = Embedder.from_path(device="cpu", dtype="float32")
    return e.embed(e.encode(TEXTS))


@pytest.fixture(scope="module")
def client(embed_server: Server) -> Iterator[openai.OpenAI]:
    url = f"{embed_server.url}/v1"
    with openai.OpenAI(base_url=url, api_key="unused", max_retries=0) as client:
        yield client


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_openai_sdk_embeddings(
    client: openai.OpenAI, expected: np.ndarray, encoding_format: str
) -> None:
    response = client.embeddings.create(
        model=MODEL,
        input=TEXTS,
        encoding_format=encoding_format,  # type: ignore[arg-type]
    )
    assert response.model == MODEL and [d.index for d in response.data] == [0, 1, 2]
    got = response.data
    if encoding_format == "base64":  # the SDK hands base64 back as given
        raw = [base64.b64decode(str(d.embedding)) for d in got]
        vectors = np.array([np.frombuffer(b, "<f4") for b in raw])
    else:
        vectors = np.array([d.embedding for d in got])
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    assert response.usage.prompt_tokens == response.usage.total_tokens > 3 * 2


def test_sdk_default_format_and_rejections(client: openai.OpenAI, expected: np.ndarray) -> None:
    default = client.embeddings.create(model=MODEL, input=TEXTS[0])  # SDK asks base64, decodes
    np.testing.assert_allclose(default.data[0].embedding, expected[0], atol=1e-5)
    with pytest.raises(openai.BadRequestError, match="Matryoshka"):
        client.embeddings.create(model=MODEL, input="a", dimensions=64)
    with pytest.raises(openai.BadRequestError, match=r"input\[0\]. has 602 tokens"):
        client.embeddings.create(model=MODEL, input=["word " * 600])
    with pytest.raises(openai.BadRequestError, match="runs the embed task"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="other", input="a")
    models = client.models.list().data
    assert [(m.id, m.model_extra["task"]) for m in models] == [(MODEL, "embed")]  # type: ignore[index]


def test_databricks_embeddings_over_the_wire(embed_server: Server) -> None:
    url = f"/serving-endpoints/{MODEL}/invocations"
    body = {"input": TEXTS[:2], "instruction": "Represent this sentence for searching:"}
    response = embed_server.http.post(url, json=body)
    assert response.status_code == 200, response.text
    got = response.json()
    assert (
        got["object"] == "list"
        and len(got["data"]) == 2
        and "completion_tokens" not in got["usage"]
    )
    e = Embedder.from_path(device="cpu", dtype="float32")
    want = e.embed(e.encode([f"{body['instruction']} {t}" for t in TEXTS[:2]]))
    np.testing.assert_allclose([d["embedding"] for d in got["data"]], want, atol=1e-5)
    bad = embed_server.http.post(url, json={"input": []})
    assert bad.status_code == 400 and bad.json()["error_code"] == "BAD_REQUEST"


#: Loaded by the server process (``sitecustomize``): a step holding token id 29999 kills the
#: embedding thread with an exception no request handling catches.
_KILLER = """
import builtins, sys
_import = builtins.__import__

class InjectedFault(BaseException):
    pass

def _patch(module):
    run_plan = module.Embedder.run_plan
    def dying_run_plan(self, plan):
        if 29999 in plan.input_ids:
            raise InjectedFault("injected by the test")
        return run_plan(self, plan)
    module.Embedder.run_plan = dying_run_plan
    module._fault_patched = True

def _hook(name, *args, **kwargs):
    module = _import(name, *args, **kwargs)
    embed = sys.modules.get("ferrollm.engine.embed")
    if embed is not None and hasattr(embed, "Embedder") and not hasattr(embed, "_fault_patched"):
        _patch(embed)
    return module

builtins.__import__ = _hook
"""


def test_embedder_death_fails_in_flight_requests_turns_health_503_and_exits_nonzero(
    tmp_path: Path,
) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_KILLER)
    pythonpath = f"{hooks}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    server = _launch(tmp_path / "server.log", {"PYTHONPATH": pythonpath})
    try:
        server.wait_ready()
        ok = server.http.post("/v1/embeddings", json={"model": MODEL, "input": "fine"})
        assert ok.status_code == 200, ok.text
        body = {"model": MODEL, "input": [[101, 29999, 102], [101, 7592, 102]]}
        killed = server.http.post("/v1/embeddings", json=body)
        after = server.http.post("/v1/embeddings", json={"model": MODEL, "input": "late"})
        health = server.http.get("/health")
        ready = server.http.get("/v2/health/ready")
        # The request in flight when the thread died gets a clean 503, as does one after it.
        assert killed.status_code == 503, killed.text
        assert "engine" in killed.json()["error"]["message"]
        assert after.status_code == 503, after.text
        assert (health.status_code, ready.status_code) == (503, 503)
        assert server.process.wait(30) != 0
        log = server.log()
        assert "the embedding thread died" in log and "exiting with status 70" in log, log
    finally:
        server.stop()
