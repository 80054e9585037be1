"""The little of ASGI the server needs: reading a bounded body, JSON and SSE responses.

No framework: a handler gets a `Request` (method, path, headers, the whole body) and returns
a `JSONResponse` or an `SSEResponse`, which the app writes with ``send``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from ferrollm.server.errors import ApiError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: The SSE end-of-stream sentinel of the OpenAI-style routes (docs/api/common.md#streaming).
SSE_DONE = b"data: [DONE]\n\n"


def sse_event(payload: bytes) -> bytes:
    """One SSE event: ``data: <one-line JSON>`` and a blank line (docs/api/common.md#streaming)."""
    return b"data: " + payload + b"\n\n"


@dataclass(slots=True)
class Request:
    """An HTTP request with its whole body; ``path_params`` come from the route's pattern."""

    method: str
    path: str
    headers: dict[bytes, bytes]
    body: bytes = b""
    path_params: dict[str, str] = field(default_factory=dict)
    #: ``time.perf_counter()`` and Unix seconds when the request arrived.
    arrival: float = field(default_factory=time.perf_counter)
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass(slots=True)
class JSONResponse:
    """A complete response: ``body`` is already-encoded JSON (or ``content_type`` text)."""

    body: bytes
    status: int = 200
    headers: tuple[tuple[bytes, bytes], ...] = ()
    content_type: bytes = b"application/json"

    async def send_to(self, send: Send) -> None:
        """Write the response."""
        headers = [
            (b"content-type", self.content_type),
            (b"content-length", str(len(self.body)).encode()),
            *self.headers,
        ]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.body, "more_body": False})


@dataclass(slots=True)
class SSEResponse:
    """A ``text/event-stream`` response: each item of ``events`` is written (and flushed) as
    soon as it is produced. Closing ``events`` early (a disconnect) aborts its request."""

    events: AsyncIterator[bytes]

    async def send_to(self, send: Send) -> None:
        """Write the stream, one ASGI body message per event."""
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        try:
            async for event in self.events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
        finally:
            await aclose(self.events)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


Response = JSONResponse | SSEResponse


async def aclose(stream: AsyncIterator[Any]) -> None:
    """Close ``stream`` if it can be closed (an async generator: its ``finally`` runs)."""
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


def header_map(scope: Scope) -> dict[bytes, bytes]:
    """The request headers, names lower-cased (ASGI already lower-cases them)."""
    return {bytes(k).lower(): bytes(v) for k, v in scope.get("headers", ())}


async def read_body(
    headers: dict[bytes, bytes], receive: Receive, limit: int, timeout: float | None = None
) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed ``limit`` bytes
    (from ``content-length`` before reading anything, else while reading), and with 408 when
    it has not all arrived within ``timeout`` seconds (a client trickling it)."""
    declared = headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    try:
        return await asyncio.wait_for(_read(receive, limit), timeout)
    except asyncio.TimeoutError:
        raise ApiError(
            408,
            f"the request body did not arrive within {timeout:g} s (body_read_timeout)",
            code="body_timeout",
            headers=((b"connection", b"close"),),
        ) from None


async def _read(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _unreadable()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _unreadable() -> ApiError:
    # Granian reports a body it cannot decode (a chunk size that is not hexadecimal, say) as a
    # disconnect, and answers an app that sends nothing with a bare 500: answer 400 instead. A
    # client that really left never reads it.
    return ApiError(
        400,
        "the request body could not be read: its framing is malformed (e.g. a chunk size "
        "that is not hexadecimal) or the connection closed before it ended",
        code="invalid_body",
        headers=((b"connection", b"close"),),
    )


def _too_large(limit: int) -> ApiError:
    # The rest of the body stays unread, so the connection cannot carry another request: say
    # so, or a keep-alive client sends its next request into a connection being torn down.
    return ApiError(
        413,
        f"the request body is larger than the server's limit of {limit} bytes",
        code="body_too_large",
        headers=((b"connection", b"close"),),
    )
