"""Hostile input over the wire: duplicate JSON keys, header floods, unknown Host headers and
clients that trickle their headers or bodies. Each gets a clear 4xx (or its connection closed)
and the server goes on serving.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from ferrollm.server.transport import HEADER_READ_TIMEOUT_MS

from .e2e_support import MODEL, Server, serving

SMALL = {"model": MODEL, "prompt": "Hi", "max_tokens": 1}
#: Every JSON route of a generation server, with a body that names one key twice (at the top
#: or nested). (/v1/embeddings shares `decode_body`; on this server it is a 400 before that.)
M = f'"model": "{MODEL}"'
DUPLICATES = {
    "/v1/completions": (f'{{{M}, "prompt": "Hi", "max_tokens": 1, "max_tokens": 2}}',
                        "max_tokens"),
    "/v1/chat/completions": (f'{{{M}, "messages": [{{"role": "user", "content": "a", '
                             '"content": "b"}]}', "content"),
    f"/v2/models/{MODEL}/generate": ('{"text_input": "Hi", "parameters": {"max_new_tokens": 1, '
                                     '"max_new_tokens": 2}}', "max_new_tokens"),
    f"/v2/models/{MODEL}/generate_stream": ('{"text_input": "a", "text_input": "b"}',
                                            "text_input"),
    f"/serving-endpoints/{MODEL}/invocations": ('{"prompt": "Hi", "prompt": "Ho"}', "prompt"),
}  # fmt: skip


def _assert_serving(server: Server) -> None:
    response = server.http.post("/v1/completions", json=SMALL)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("path", list(DUPLICATES))
def test_a_duplicate_json_key_is_refused_naming_the_key(server: Server, path: str) -> None:
    body, key = DUPLICATES[path]
    response = server.http.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert f"`{key}`: the key appears twice in one JSON object" in response.text
    # the same keys in different objects are not duplicates
    ok = f'{{{M}, "max_tokens": 1, "messages": [{{"role": "user", "content": "a"}}, '
    ok += '{"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}'
    assert server.http.post("/v1/chat/completions", content=ok).status_code == 200


def _raw(server: Server, request: bytes, timeout: float = 30.0) -> bytes:
    """Send ``request`` on a fresh connection; everything the server answers until it closes
    (or ``timeout`` passes)."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(request)
        return _read_all(sock)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except (ConnectionResetError, TimeoutError):
        pass
    return b"".join(chunks)


def _status(answer: bytes) -> int | None:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


@pytest.mark.parametrize("flood", ["many headers", "one huge header"])
def test_a_header_flood_is_refused_and_serving_goes_on(server: Server, flood: str) -> None:
    if flood == "many headers":
        headers = b"".join(b"x-flood-%d: %s\r\n" % (i, b"v" * 100) for i in range(2000))
    else:
        headers = b"x-huge: " + b"h" * 1_000_000 + b"\r\n"
    request = b"GET /health HTTP/1.1\r\nhost: a\r\n" + headers + b"\r\n"
    try:
        answer = _raw(server, request)
    except (BrokenPipeError, ConnectionResetError):
        answer = b""  # cut off while still sending: refused too
    status = _status(answer)
    assert status is None or 400 <= status < 500, answer[:200]
    _assert_serving(server)


def test_any_host_is_served_by_default(server: Server) -> None:
    answer = _raw(
        server, b"GET /health HTTP/1.1\r\nhost: evil.example\r\nconnection: close\r\n\r\n"
    )
    assert _status(answer) == 200, answer[:200]


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(
        tmp_path_factory.mktemp("strict"),
        "--allowed-host", "127.0.0.1",
        "--allowed-host", "LocalHost",
        "--body-read-timeout", "1",
    ) as server:  # fmt: skip
        yield server


def test_an_unknown_host_is_refused_with_400_when_hosts_are_configured(
    strict_server: Server,
) -> None:
    for host, status in [
        (b"evil.example", 400),
        (b"evil.example:80", 400),
        (b"127.0.0.1.evil.example", 400),
        (b"localhost:8000", 200),
        (b"LOCALHOST", 200),
    ]:
        request = b"GET /health HTTP/1.1\r\nhost: %s\r\nconnection: close\r\n\r\n" % host
        answer = _raw(strict_server, request)
        assert _status(answer) == status, (host, answer[:300])
        if status == 400:
            assert b"is not a name this server answers to (--allowed-host)" in answer
    _assert_serving(strict_server)  # httpx sends Host: 127.0.0.1:<port>


def test_a_body_trickled_slower_than_the_body_timeout_gets_408(strict_server: Server) -> None:
    host, port = strict_server.url.removeprefix("http://").split(":")
    head = (
        b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: 200\r\n\r\n"
    )
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head)
        answer = b""
        for _ in range(40):  # a byte every 0.1 s: 4 s for 40 of the 200 bytes
            try:
                sock.sendall(b" ")
            except (BrokenPipeError, ConnectionResetError):
                break
            sock.settimeout(0.1)
            try:
                answer += sock.recv(65536)
            except TimeoutError:
                continue
            if answer:
                break
        sock.settimeout(10)
        answer += _read_all(sock)
    assert _status(answer) == 408, answer[:300]
    assert b"body_read_timeout" in answer
    assert b'"type":"invalid_request_error"' in answer  # the client's fault, not ours
    assert time.monotonic() - started < 5.0
    _assert_serving(strict_server)


def test_headers_trickled_slower_than_the_header_timeout_are_cut_off(
    strict_server: Server,
) -> None:
    host, port = strict_server.url.removeprefix("http://").split(":")
    limit_s = HEADER_READ_TIMEOUT_MS / 1000
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=limit_s + 20) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n")  # never finished
        answer = _read_all(sock)  # returns when the server closes the connection
    elapsed = time.monotonic() - started
    assert limit_s - 1 <= elapsed < limit_s + 10, elapsed
    assert _status(answer) in (None, 408), answer[:300]
    _assert_serving(strict_server)


@pytest.mark.parametrize(
    "chunks",
    [b"zz\r\n{}\r\n0\r\n\r\n", b"2\r\n{}XX0\r\n\r\n", b"-1\r\n{}\r\n0\r\n\r\n"],
    ids=["size-not-hex", "no-crlf-after-data", "negative-size"],
)
def test_broken_chunked_framing_is_a_400_not_a_500(server: Server, chunks: bytes) -> None:
    """Granian reports a body it cannot decode as a disconnect and answered the app's silence
    with a bare 500; the client's broken framing is a 400, and the connection closes."""
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunks
    )
    answer = _raw(server, request)
    assert _status(answer) == 400, answer[:300]
    assert b'"code":"invalid_body"' in answer and b"connection: close" in answer.lower()
    _assert_serving(server)
