"""``ferrollm serve --tensor-parallel-size 2`` as a real process group on a tiny model (gloo).

The server spawns its worker; its completions must equal the offline TP=1 engine's, streamed
or not. SIGKILLing the worker mid-stream must end the stream with an error naming the rank,
turn readiness 503 and end every process of the group non-zero; a worker that cannot start
(launcher-placed, with a bad option) must make the server exit non-zero naming the rank. Every
wait is bounded (the servers' group timeout is ``TIMEOUT_S``; process waits have timeouts).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferrollm import LLM, SamplingParams
from tiny_models import build_tiny_model

from .e2e_support import Server, _group, free_port, launch_server, serving, sse_payloads

TIMEOUT_S = 30
#: The tiny model's context is 512: the default servers' 2048 does not fit it.
TINY_FLAGS = ("--max-model-len", "256", "--kv-cache-memory", "16MiB")
TP2 = ("--tensor-parallel-size", "2", "--distributed-timeout", str(TIMEOUT_S))
PROMPTS = ["Hello world", "def f(x): return x * 2"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("llama3", tmp_path_factory.mktemp("tp-model"))


@pytest.fixture(scope="module")
def tp_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("tp"), str(model_dir), *TINY_FLAGS, *TP2) as server:
        yield server


def _completion(server: Server, prompt: str, *, stream: bool) -> str:
    body = {"model": "tp-model0", "prompt": prompt, "max_tokens": 12, "temperature": 0}
    if not stream:
        response = server.http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        return str(response.json()["choices"][0]["text"])
    response = server.http.post("/v1/completions", json={**body, "stream": True})
    assert response.status_code == 200, response.text
    payloads = sse_payloads(response.content)
    assert payloads[-1] == "[DONE]"
    return "".join(json.loads(p)["choices"][0]["text"] for p in payloads[:-1])


def test_tp2_server_completes_as_the_tp1_engine(tp_server: Server, model_dir: Path) -> None:
    llm = LLM(model_dir, dtype="float32", quantization="none", max_model_len=256)
    greedy = SamplingParams(temperature=0, max_tokens=12)
    expected = [out.outputs[0].text for out in llm.generate(PROMPTS, greedy)]
    for prompt, text in zip(PROMPTS, expected, strict=True):
        assert _completion(tp_server, prompt, stream=False) == text
        assert _completion(tp_server, prompt, stream=True) == text


def _workers(server: Server) -> list[int]:
    """The pids of the server's tensor-parallel workers."""
    found = []
    for pid in _group(server.process.pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"ferrollm.distributed.worker" in cmdline:
            found.append(pid)
    return found


def test_killing_a_worker_mid_stream_fails_the_stream_and_ends_the_group(
    model_dir: Path, tmp_path: Path
) -> None:
    server = launch_server(tmp_path, str(model_dir), *TINY_FLAGS, *TP2)
    try:
        server.wait_ready()
        (worker,) = _workers(server)
        body = {
            "model": "tp-model0",
            "prompt": "Once upon a time",
            "max_tokens": 240,
            "ignore_eos": True,
            "stream": True,
        }
        with server.http.stream("POST", "/v1/completions", json=body) as r:
            chunks = r.iter_bytes()
            head = next(chunks)
            os.kill(worker, signal.SIGKILL)
            rest = b"".join(chunks)
            ready = server.http.get("/v2/health/ready")
        payloads = sse_payloads(head + rest)
        assert payloads[-1] == "[DONE]"
        error = payloads[-2]
        assert "tensor-parallel rank 1" in error and "SIGKILL" in error, error
        assert ready.status_code == 503, ready.text
        assert server.process.wait(TIMEOUT_S) != 0
        deadline = time.monotonic() + TIMEOUT_S
        while _group(server.process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _group(server.process.pid)
        log = server.log()
        assert "the tensor-parallel group failed" in log and "rank 1" in log
    finally:
        server.stop()


def test_a_worker_that_cannot_start_makes_the_server_exit_nonzero_naming_it(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    launcher = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    bad_option = ("--block-size", "0")
    worker = subprocess.Popen(
        [sys.executable, "-m", "ferrollm", "serve", str(model_dir), *TINY_FLAGS, *TP2, *bad_option],
        stdin=subprocess.DEVNULL,
        env={**os.environ, **launcher, "RANK": "1"},
    )
    for name, value in {**launcher, "RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    server = launch_server(tmp_path, str(model_dir), *TINY_FLAGS, *TP2)
    try:
        assert server.process.wait(TIMEOUT_S) != 0
        assert worker.wait(TIMEOUT_S) != 0
        log = server.log()
        assert "tensor-parallel rank 1 failed to start" in log and "block_size" in log, log
    finally:
        worker.kill()
        worker.wait()
        server.stop()
