"""Keys, TLS with client verification, deadlines, graceful drain and engine death, against real
``ferrollm serve`` processes and real TLS clients.

Certificates are made in the test with the ``openssl`` CLI (a CA, a server certificate for
127.0.0.1 and a client certificate); the module fails (not skips) where openssl is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .e2e_support import MODEL, Server, launch_server, sse_payloads

KEY = "e2e-key-0123456789"
AUTH = {"authorization": f"Bearer {KEY}"}
LONG = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True}


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certificates(folder: Path) -> dict[str, Path]:
    """A CA, and a server (SAN 127.0.0.1) and a client certificate it signed."""
    assert shutil.which("openssl"), "the TLS tests need the openssl CLI"
    days = ("-days", "2")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.pem", "-subj", "/CN=ferrollm test CA", *days, cwd=folder)  # fmt: skip
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                 f"{name}.csr", "-subj", f"/CN={name}", cwd=folder)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-extfile", "san.ext", *days,
                 cwd=folder)  # fmt: skip
    return {
        n: folder / n for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")
    }


def _tls(certs: dict[str, Path], *, client_cert: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs["ca.pem"]))
    if client_cert:
        context.load_cert_chain(str(certs["client.pem"]), str(certs["client.key"]))
    return context


@pytest.fixture(scope="module")
def tls_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Server, dict[str, Path]]]:
    """A server with TLS, client verification, an API key and a short drain window."""
    certs = make_certificates(tmp_path_factory.mktemp("certs"))
    server = launch_server(
        tmp_path_factory.mktemp("tls"),
        "--ssl-certfile", str(certs["server.pem"]), "--ssl-keyfile", str(certs["server.key"]),
        "--ssl-ca-certs", str(certs["ca.pem"]), "--api-key", KEY, "--drain-timeout", "60",
    )  # fmt: skip
    server.url = server.url.replace("http://", "https://")
    server.http = httpx.Client(
        base_url=server.url, verify=_tls(certs, client_cert=True), timeout=120.0
    )
    try:
        server.wait_ready()
        yield server, certs
    finally:
        server.stop()
    assert "Traceback" not in server.log(), server.log()


def test_tls_with_a_client_certificate_and_a_key_is_served(
    tls_server: tuple[Server, dict[str, Path]],
) -> None:
    server, _ = tls_server
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 3}
    response = server.http.post("/v1/completions", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 3
    refused = server.http.post("/v1/completions", json=body)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert server.http.get("/health").status_code == 200  # public without a key


def test_tls_refuses_a_client_without_a_certificate_and_plain_http(
    tls_server: tuple[Server, dict[str, Path]],
) -> None:
    server, certs = tls_server
    anonymous = httpx.Client(base_url=server.url, verify=_tls(certs, client_cert=False))
    plain = httpx.Client(base_url=server.url.replace("https://", "http://"))
    with anonymous, plain:
        with pytest.raises(httpx.TransportError):
            anonymous.get("/health")
        with pytest.raises(httpx.TransportError):
            plain.get("/health")


def test_the_mindie_timeout_ends_the_stream_with_its_timeout_frame(
    tls_server: tuple[Server, dict[str, Path]],
) -> None:
    server, _ = tls_server
    body = {"text_input": "Once upon a time", "parameters": {"max_new_tokens": 1000, "timeout": 1}}
    started = time.monotonic()
    response = server.http.post(f"/v2/models/{MODEL}/generate_stream", json=body, headers=AUTH)
    elapsed = time.monotonic() - started
    frames = [json.loads(p) for p in sse_payloads(response.content)]
    last = frames[-1]
    assert last["details"]["finish_reason"] == "stop_sequence", last
    assert last["err_msg"] == "request timed out after 1 s"
    assert elapsed < 30  # ended by the deadline, not by 1000 tokens


def test_sigterm_drains_in_flight_streams_then_exits_0(
    tls_server: tuple[Server, dict[str, Path]],
) -> None:
    """Runs last in this module: the server is gone afterwards."""
    server, _ = tls_server
    num = 3
    results: list[httpx.Response | BaseException] = []
    first_bytes = threading.Barrier(num + 1)

    def stream() -> None:
        body = {**LONG, "max_tokens": 48, "stream": True}
        try:
            with server.http.stream("POST", "/v1/completions", json=body, headers=AUTH) as r:
                chunks = r.iter_bytes()
                head = next(chunks)
                first_bytes.wait(60)
                results.append(httpx.Response(r.status_code, content=head + b"".join(chunks)))
        except BaseException as e:
            results.append(e)
            first_bytes.abort()

    threads = [threading.Thread(target=stream) for _ in range(num)]
    for t in threads:
        t.start()
    first_bytes.wait(120)  # every stream is under way
    os.kill(server.process.pid, signal.SIGTERM)
    for t in threads:
        t.join(180)
    completed = 0
    for result in results:
        assert isinstance(result, httpx.Response), repr(result)
        payloads = sse_payloads(result.content)
        assert payloads[-1] == "[DONE]"
        chunks = [json.loads(p) for p in payloads[:-1]]
        assert chunks[-1]["choices"][-1]["finish_reason"] == "length", chunks[-1]
        assert chunks[-1]["usage"]["completion_tokens"] == 48
        completed += 1
    assert server.process.wait(60) == 0
    # Granian finishes the open connections' requests before the lifespan's shutdown, so the
    # app's own drain finds nothing left to wait for: nothing was cut.
    log = server.log()
    assert "Shutting down granian" in log and "drained: all 0 requests" in log, log
    assert "Killing worker" not in log
    print(f"drain: {num} in flight at SIGTERM, {completed} completed")


_KILLER = """
import builtins, sys
_import = builtins.__import__

class InjectedFault(BaseException):
    pass

def _patch(loop):
    apply = loop.EngineLoop._apply
    def dying_apply(self, commands):
        for c in commands:
            prompt = getattr(getattr(c, "request", None), "prompt", None) or ""
            if "KILL-ENGINE" in prompt:
                raise InjectedFault("injected by the test")
        return apply(self, commands)
    loop.EngineLoop._apply = dying_apply
    loop._fault_patched = True

def _hook(name, *args, **kwargs):
    module = _import(name, *args, **kwargs)
    loop = sys.modules.get("ferrollm.engine.loop")
    if loop is not None and hasattr(loop, "EngineLoop") and not hasattr(loop, "_fault_patched"):
        _patch(loop)
    return module

builtins.__import__ = _hook
"""


def test_engine_death_fails_in_flight_requests_turns_health_503_and_exits_nonzero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_KILLER)
    monkeypatch.setenv("PYTHONPATH", f"{hooks}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    server = launch_server(tmp_path)
    try:
        server.wait_ready()
        body: dict[str, Any] = {**LONG, "stream": True}
        with server.http.stream("POST", "/v1/completions", json=body) as r:
            chunks = r.iter_bytes()
            head = next(chunks)
            kill = {"model": MODEL, "prompt": "KILL-ENGINE", "max_tokens": 2}
            killed = server.http.post("/v1/completions", json=kill)
            health = server.http.get("/health")
            ready = server.http.get("/v2/health/ready")
            rest = b"".join(chunks)
        payloads = sse_payloads(head + rest)
        assert payloads[-1] == "[DONE]"
        assert "engine" in json.loads(payloads[-2])["err_msg"]
        assert killed.status_code == 503, killed.text
        assert (health.status_code, ready.status_code) == (503, 503)
        assert server.process.wait(30) != 0
        assert "the engine thread died" in server.log()
    finally:
        server.stop()


def test_overload_and_the_per_key_cap_over_the_wire(tmp_path: Path) -> None:
    """A burst past the queue bound gets 503s with Retry-After and loses nothing; a key past
    its cap gets 429 while another key is served."""
    keys = [f"key-{i}" for i in range(6)]
    flags = [f for key in keys for f in ("--api-key", key)]
    server = launch_server(
        tmp_path, "--max-waiting-requests", "1", "--max-concurrent-per-key", "2", *flags
    )
    try:
        server.wait_ready()
        results: list[httpx.Response | BaseException] = []

        def send(key: str) -> None:
            body = {"model": MODEL, "prompt": "Hello", "max_tokens": 8, "ignore_eos": True}
            try:
                headers = {"authorization": f"Bearer {key}"}
                results.append(server.http.post("/v1/completions", json=body, headers=headers))
            except BaseException as e:
                results.append(e)

        threads = [threading.Thread(target=send, args=(key,)) for key in keys * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(results) == 12 and all(isinstance(r, httpx.Response) for r in results)
        statuses = sorted(r.status_code for r in results if isinstance(r, httpx.Response))
        assert set(statuses) == {200, 503}, statuses
        for r in results:
            assert isinstance(r, httpx.Response)
            if r.status_code == 503:
                assert int(r.headers["retry-after"]) >= 1
                assert r.json()["error"]["code"] == "overloaded"
            else:
                assert r.json()["usage"]["completion_tokens"] == 8
        # Two streams of key 0 in flight: a third is over its cap; key 1 is served.
        body = {**LONG, "stream": True}  # 400 tokens: in flight for seconds
        headers = {"authorization": f"Bearer {keys[0]}"}
        # One at a time: with --max-waiting-requests 1 the second would be refused (503)
        # while the first waits for its first step.
        with server.http.stream("POST", "/v1/completions", json=body, headers=headers) as one:
            assert one.status_code == 200
            one_chunks = one.iter_bytes()  # kept: a dropped iterator closes the connection
            next(one_chunks)
            with server.http.stream("POST", "/v1/completions", json=body, headers=headers) as two:
                assert two.status_code == 200
                two_chunks = two.iter_bytes()
                next(two_chunks)
                # both streams are in flight (the gauge), neither is waiting any more
                gauges = server.metrics()
                assert gauges["ferrollm_requests_in_flight"] == 2
                assert gauges["ferrollm_admission_waiting_requests"] == 0
                assert gauges["ferrollm_admission_waiting_prompt_tokens"] == 0
                small = {"model": MODEL, "prompt": "Hi", "max_tokens": 1}
                third = server.http.post("/v1/completions", json=small, headers=headers)
                other = server.http.post(
                    "/v1/completions", json=small, headers={"authorization": f"Bearer {keys[1]}"}
                )
        assert third.status_code == 429, third.text
        assert third.json()["error"]["type"] == "rate_limit_error"
        assert other.status_code == 200, other.text
        # Closing the two streams frees key 0's slots once the server has seen the disconnects
        # (at its next engine step), not at once: wait for that before key 0 sends again.
        deadline = time.monotonic() + 30
        while server.metrics()["ferrollm_requests_in_flight"] != 0:
            assert time.monotonic() < deadline, "the closed streams were never released"
            time.sleep(0.05)
        # a wrong key (401) and a deadline that has passed before any step (504)
        wrong = server.http.post("/v1/completions", json=small, headers={"authorization": "x"})
        assert wrong.status_code == 401
        late = {**small, "timeout": 1e-6}
        assert server.http.post("/v1/completions", json=late, headers=headers).status_code == 504
        # the admission metrics count every refusal by its reason
        rejected = _rejected(server)
        assert rejected["overloaded"] == statuses.count(503) > 0
        assert rejected["per_key_limit"] == 1
        assert rejected["unauthorized"] == 1
        assert rejected["deadline"] == 1
        assert rejected["shutting_down"] == rejected["invalid"] == rejected["error"] == 0
        assert server.metrics()["ferrollm_requests_in_flight"] == 0
    finally:
        server.stop()
    assert "Traceback" not in server.log()


def _rejected(server: Server) -> dict[str, float]:
    """``ferrollm_requests_rejected_total`` by reason."""
    text = server.http.get("/metrics").text
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ferrollm_requests_rejected_total":
                found[sample.labels["reason"]] = sample.value
    return found
