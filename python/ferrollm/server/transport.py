"""Granian's transport options from the server config: TLS, client-certificate verification,
slow-client timeouts, and how long a worker may take to drain before it is killed.

Importing this module does not import Granian: the CLI calls `granian_options` only when it
starts the server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ferrollm.server_config import ServerConfig

#: Milliseconds a client may take to send its request headers (a trickling client is cut).
HEADER_READ_TIMEOUT_MS = 10_000
#: Bytes of request headers buffered at most (a header flood is refused).
MAX_HEADER_BUFFER = 64 * 1024
#: Seconds past ``drain_timeout`` the worker gets to stop before Granian kills it: the
#: requests still running at the drain timeout write their error events, the engine thread
#: finishes its step and stops, the process exits. With both cores of a 2-core box busy in
#: other processes that took 1-3 s (tests/e2e/test_e2e_drain.py), too close to the earlier
#: margin of 2 s.
KILL_MARGIN_S = 10


def granian_options(config: ServerConfig) -> dict[str, Any]:
    """Keyword arguments of ``Granian(...)`` for ``config``."""
    from granian.http import HTTP1Settings

    options: dict[str, Any] = {
        "http1_settings": HTTP1Settings(
            header_read_timeout=HEADER_READ_TIMEOUT_MS, max_buffer_size=MAX_HEADER_BUFFER
        ),
        "workers_kill_timeout": int(config.drain_timeout) + KILL_MARGIN_S,
    }
    if config.ssl_certfile is not None and config.ssl_keyfile is not None:
        options["ssl_cert"] = Path(config.ssl_certfile)
        options["ssl_key"] = Path(config.ssl_keyfile)
    if config.ssl_ca_certs is not None:
        options["ssl_ca"] = Path(config.ssl_ca_certs)
        options["ssl_client_verify"] = True
    return options
