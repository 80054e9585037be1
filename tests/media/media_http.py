"""The routes of the fetch tests' http.server (see conftest.py's ``media_server``): what each
path answers, and the state the tests read back."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

Route = Callable[[BaseHTTPRequestHandler, "MediaServer"], None]


@dataclass
class MediaServer:
    """Routes by path; ``requests`` lists the paths asked for, ``streamed`` the bytes the
    streaming route managed to send before the client hung up."""

    port: int = 0
    routes: dict[str, Route] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    streamed: int = 0
    stream_done: threading.Event = field(default_factory=threading.Event)

    def url(self, path: str, host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"


def send(handler: BaseHTTPRequestHandler, body: bytes, status: int = 200) -> None:
    handler.send_response(status)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def redirect(location: str) -> Route:
    def route(handler: BaseHTTPRequestHandler, server: MediaServer) -> None:
        handler.send_response(302)
        handler.send_header("Location", location.format(port=server.port))
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return route


def slow(seconds: float) -> Route:
    def route(handler: BaseHTTPRequestHandler, server: MediaServer) -> None:
        time.sleep(seconds)
        with contextlib.suppress(OSError):  # the client gave up, as it should
            send(handler, b"late")

    return route


def endless(limit: int) -> Route:
    """Streams zeros with no Content-Length until the client hangs up or ``limit`` bytes."""

    def route(handler: BaseHTTPRequestHandler, server: MediaServer) -> None:
        handler.send_response(200)
        handler.send_header("Connection", "close")
        handler.end_headers()
        chunk = b"\x89PNG\r\n\x1a\n" + bytes(65536 - 8)
        try:
            while server.streamed < limit:
                handler.wfile.write(chunk)
                handler.wfile.flush()
                server.streamed += len(chunk)
        except OSError:
            pass
        finally:
            server.stream_done.set()

    return route
