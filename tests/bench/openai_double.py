"""A test double of an OpenAI-compatible server: an http.server on 127.0.0.1 whose streams
have known delays.

Every streaming POST to /v1/completions or /v1/chat/completions answers ``num_tokens`` text
chunks: the first after ``ttft_s`` (``slow_ttft_s`` for every second request received, so
exactly half the requests of a run are slow whatever their order), the others ``itl_s``
apart, then a ``usage`` chunk and ``[DONE]``. GET /v1/models lists ``MODEL``. The bodies it
received are kept, for tests of what the bench sends.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "double-model"


@dataclass
class Double:
    """The double's timings, and what it has seen."""

    ttft_s: float = 0.05
    slow_ttft_s: float = 0.05
    itl_s: float = 0.02
    num_tokens: int = 4
    prompt_tokens: int = 7
    url: str = ""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_ttft(self, body: dict[str, Any]) -> float:
        with self.lock:
            self.bodies.append(body)
            return self.slow_ttft_s if len(self.bodies) % 2 == 0 else self.ttft_s


def _handler(double: Double) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            chat = self.path == "/v1/chat/completions"
            time.sleep(double.next_ttft(body))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(double.num_tokens):
                if i:
                    time.sleep(double.itl_s)
                choice = {"index": 0, "delta": {"content": f"t{i}"}} if chat else {
                    "index": 0, "text": f"t{i}"
                }  # fmt: skip
                self._event({"choices": [choice]})
            usage = {"prompt_tokens": double.prompt_tokens, "completion_tokens": double.num_tokens}
            self._event({"choices": [], "usage": usage})
            self._send(b"data: [DONE]\n\n")
            self._send(b"")

        def _event(self, chunk: dict[str, Any]) -> None:
            self._send(f"data: {json.dumps(chunk)}\n\n".encode())

        def _send(self, data: bytes) -> None:  # one HTTP/1.1 chunk ("" ends the body)
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@contextmanager
def serving_double(double: Double) -> Iterator[Double]:
    """``double`` served on a free port of 127.0.0.1 (its ``url`` set) until the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(double))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    double.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield double
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
