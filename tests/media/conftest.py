"""http.servers on 127.0.0.1 in a thread for the fetch tests, recording every request they
see, so a test can show that a refused URL was never connected to; ``tls_media_server`` speaks
https with a self-signed certificate for ``localhost`` (made with the openssl command)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from media_http import MediaServer, send


@pytest.fixture
def media_server() -> Iterator[MediaServer]:
    yield from _serve(None)


@pytest.fixture
def tls_media_server(tmp_path: Path) -> Iterator[tuple[MediaServer, Path]]:
    """An https server and the certificate a client must trust to reach it as localhost."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    for server in _serve(context):
        yield server, cert


def _serve(tls: ssl.SSLContext | None) -> Iterator[MediaServer]:
    state = MediaServer()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            state.requests.append(self.path)
            route = state.routes.get(self.path)
            if route is None:
                send(self, b"no such file", 404)
            else:
                route(self, state)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    server.block_on_close = False
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
