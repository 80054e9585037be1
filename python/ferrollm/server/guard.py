"""What every request passes before its handler: API keys, the per-key cap, and the drain.

`Guard.admit(path, headers)` is the app's one call site: it refuses a request whose key is
missing or wrong (401), whose key has too many requests in flight (429), or that arrives while
the server drains (503), and counts the request in flight until the response is written.
`Guard.start_drain()` runs at the termination signal (and `Guard.drain(timeout)` at the
lifespan's shutdown, which Granian runs once the open connections are done): readiness turns
503, new requests get 503, and the requests in flight get up to ``timeout`` seconds from the
signal to finish; the app ends the rest with their route's error (`App`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from ferrollm.server.auth import KeyRing
from ferrollm.server.errors import ApiError
from ferrollm.server.playground import open_paths
from ferrollm.server_config import ServerConfig

logger = logging.getLogger("ferrollm.server")

#: The worker's exit status when the engine thread died (Granian then exits non-zero too).
EXIT_ENGINE_DEAD = 70
#: Seconds the clean errors of in-flight requests get to reach their clients before the
#: process exits after the engine died.
DEATH_FLUSH_S = 1.0


class Guard:
    """Keys, the per-key cap and the drain of one server (lives on the event loop)."""

    def __init__(self, config: ServerConfig, environ: Mapping[str, str] = os.environ) -> None:
        self.keys = KeyRing(config, environ)
        self._hosts = frozenset(config.allowed_hosts)
        self._public = open_paths(config)
        self.draining = False
        self._drain_started: float | None = None
        self.num_in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextmanager
    def admit(self, path: str, headers: Mapping[bytes, bytes]) -> Iterator[None]:
        """Hold one request in flight for the block; raises 400 (a Host not allowed), 401,
        429 or 503 (draining)."""
        if self._hosts:
            self._check_host(headers.get(b"host"))
        public = path in self._public
        if self.draining and not public:
            raise ApiError(
                503,
                "the server is shutting down and takes no new requests",
                code="shutting_down",
                headers=((b"connection", b"close"),),
            )
        index = self.keys.identify(path, headers)
        with self.keys.hold(index):
            if public:
                yield
                return
            self.num_in_flight += 1
            self._idle.clear()
            try:
                yield
            finally:
                self.num_in_flight -= 1
                if self.num_in_flight == 0:
                    self._idle.set()

    def _check_host(self, value: bytes | None) -> None:
        host = (value or b"").decode("latin-1").strip().lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host  # drop the port
        if name.startswith("[") and "]" in name:  # an IPv6 literal: [::1]:8000
            name = name[: name.index("]") + 1]
        if name not in self._hosts:
            raise ApiError(
                400,
                f"the Host header {host[:200]!r} is not a name this server answers to "
                "(--allowed-host)",
                param="host",
                code="host_not_allowed",
            )

    def start_drain(self) -> None:
        """Refuse new requests from now on; the drain's clock starts at the first call (the
        termination signal, else the lifespan shutdown)."""
        if self._drain_started is None:
            self._drain_started = time.monotonic()
            self.draining = True
            logger.info("draining: %d requests in flight", self.num_in_flight)

    async def drain(self, timeout: float) -> bool:
        """Refuse new requests and wait for those in flight until ``timeout`` s after the
        drain started; whether all of them finished."""
        self.start_drain()
        assert self._drain_started is not None
        remaining = max(0.0, timeout - (time.monotonic() - self._drain_started))
        num = self.num_in_flight
        if not await self.wait_idle(remaining):
            logger.warning(
                "drain timeout (%g s): %d of %d requests still in flight",
                timeout,
                self.num_in_flight,
                num,
            )
            return False
        logger.info("drained: all %d requests in flight finished", num)
        return True

    async def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for no request to be in flight; whether none is."""
        if self._idle.is_set():
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


def exit_on_engine_death(cause: BaseException) -> None:
    """The engine thread died: let the in-flight requests' errors go out, then exit the
    worker non-zero so that a supervisor restarts the server."""
    logger.critical("the engine died (%r); exiting with status %d", cause, EXIT_ENGINE_DEAD)
    asyncio.get_running_loop().call_later(DEATH_FLUSH_S, os._exit, EXIT_ENGINE_DEAD)
