"""API keys: ``Authorization: Bearer <key>`` on every route but the public ones, and a cap on
the requests one key may have in flight.

Keys come from ``--api-key`` (repeatable), ``--api-key-file`` (one a line) and the
``FERROLLM_API_KEYS`` environment variable (comma- or whitespace-separated); with none at all
the server is open. A key is compared against every configured key with
``hmac.compare_digest`` (no early exit, so the time taken says nothing about how much of a
guess was right), and is never logged: the log names a key by its index.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from ferrollm.config import EngineConfigError
from ferrollm.server.errors import ApiError
from ferrollm.server.playground import open_paths
from ferrollm.server_config import ServerConfig

logger = logging.getLogger("ferrollm.server")

#: The environment variable of extra API keys.
KEYS_ENV = "FERROLLM_API_KEYS"


def load_api_keys(config: ServerConfig, environ: Mapping[str, str] = os.environ) -> list[str]:
    """Every configured key, in order, without duplicates."""
    keys = list(config.api_keys)
    if config.api_key_file is not None:
        try:
            with open(config.api_key_file, encoding="utf-8") as f:
                lines = [line.strip() for line in f]
        except (OSError, UnicodeDecodeError) as e:
            raise EngineConfigError("api_key_file", f"cannot read `api_key_file`: {e}") from None
        keys += [line for line in lines if line and not line.startswith("#")]
    keys += environ.get(KEYS_ENV, "").replace(",", " ").split()
    return list(dict.fromkeys(keys))


class KeyRing:
    """The configured keys, the public paths, and each key's requests in flight."""

    def __init__(self, config: ServerConfig, environ: Mapping[str, str] = os.environ) -> None:
        self._keys = [key.encode() for key in load_api_keys(config, environ)]
        self._public = open_paths(config)
        self._max_in_flight = config.max_concurrent_per_key
        self._in_flight = [0] * len(self._keys)

    @property
    def enabled(self) -> bool:
        """Whether any key is configured."""
        return bool(self._keys)

    def identify(self, path: str, headers: Mapping[bytes, bytes]) -> int | None:
        """The index of the request's key; None for an open server or a public path.
        Raises a 401 ApiError (with ``WWW-Authenticate``) for a missing or wrong key."""
        if not self._keys or path in self._public:
            return None
        value = headers.get(b"authorization")
        if value is None:
            raise _unauthorized(path, "no `Authorization: Bearer <key>` header")
        scheme, _, token = value.strip().partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            raise _unauthorized(path, "the `Authorization` header is not `Bearer <key>`")
        index = self._match(token.strip())
        if index is None:
            raise _unauthorized(path, "the API key is not valid")
        return index

    def _match(self, token: bytes) -> int | None:
        found = None
        for index, key in enumerate(self._keys):  # every key, always: constant time
            if hmac.compare_digest(key, token):
                found = index
        return found

    @contextmanager
    def hold(self, index: int | None) -> Iterator[None]:
        """One request of key ``index`` in flight; 429 past ``max_concurrent_per_key``."""
        if index is None:
            yield
            return
        if self._in_flight[index] >= self._max_in_flight:
            logger.warning(
                "API key #%d is over its %d requests in flight", index, self._max_in_flight
            )
            raise ApiError(
                429,
                f"this API key already has {self._max_in_flight} requests in flight "
                "(max_concurrent_per_key); retry when one has finished",
                code="too_many_requests",
                headers=((b"retry-after", b"1"),),
            )
        self._in_flight[index] += 1
        try:
            yield
        finally:
            self._in_flight[index] -= 1


def _unauthorized(path: str, reason: str) -> ApiError:
    logger.warning("401 on %s: %s", path, reason)  # the key itself is never logged
    return ApiError(
        401,
        f"unauthorized: {reason}; send `Authorization: Bearer <API key>`",
        code="invalid_api_key",
        headers=((b"www-authenticate", b'Bearer realm="ferrollm"'),),
    )
