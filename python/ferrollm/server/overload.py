"""Admission control: a request enters the engine only while the queue ahead of it is short.

"Waiting" is a request that the server has handed to the engine and that has not had its first
step yet (its first output has not arrived). Past ``max_waiting_requests`` such requests, or
``max_waiting_tokens`` of their prompt tokens, a new request is refused at once with 503 and a
``Retry-After`` of how long the queue ahead takes to drain at the rate measured over the
latest departures, so that an overloaded server answers fast instead of letting every
request's latency grow without bound. A request larger than the token bound alone is still
admitted into an empty queue (it would otherwise never run); a batch of prompts that could not
wait together even in an idle server is refused at once with 413 (`Admission.check_batch`).
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ferrollm.server.errors import ApiError
from ferrollm.server_config import ServerConfig

#: Departures the drain rate is measured over.
RATE_WINDOW = 64
#: Bounds of ``Retry-After`` (seconds).
MIN_RETRY_S, MAX_RETRY_S = 1, 60


class Admission:
    """The server's queue bound (one per server; lives on the event loop)."""

    def __init__(self, config: ServerConfig) -> None:
        self.max_waiting_requests = config.max_waiting_requests
        self.max_waiting_tokens = config.max_waiting_tokens
        self.num_waiting = 0
        self.num_waiting_tokens = 0
        self.num_rejected = 0
        self._departures: collections.deque[float] = collections.deque(maxlen=RATE_WINDOW)

    def drain_rate(self) -> float | None:
        """Requests leaving the queue per second, over the latest departures (None: too few
        measured yet)."""
        if len(self._departures) < 2:
            return None
        span = time.monotonic() - self._departures[0]
        return (len(self._departures) - 1) / span if span > 0 else None

    def retry_after(self) -> int:
        """Seconds until the queue ahead has drained, at the measured rate."""
        rate = self.drain_rate()
        if rate is None:
            return MIN_RETRY_S
        return max(MIN_RETRY_S, min(MAX_RETRY_S, math.ceil((self.num_waiting + 1) / rate)))

    def check_batch(self, num_requests: int, num_prompt_tokens: int | None = None) -> None:
        """Raise a 413 ApiError naming ``prompt`` for a batch of ``num_requests`` engine
        requests (``num_prompt_tokens`` in all, once known) that could not wait even in an idle
        server: retrying it could never succeed, unlike the 503 of `check`. One request may
        exceed the token bound alone (it is admitted into an empty queue)."""
        if num_requests > self.max_waiting_requests:
            raise ApiError(
                413,
                f"`prompt` has {num_requests} entries; a request may have at most "
                f"{self.max_waiting_requests} (max_waiting_requests: no more can wait at once)",
                param="prompt",
                code="too_many_prompts",
            )
        too_many_tokens = num_prompt_tokens is not None and (
            num_requests > 1 and num_prompt_tokens > self.max_waiting_tokens
        )
        if too_many_tokens:
            raise ApiError(
                413,
                f"`prompt` holds {num_prompt_tokens} prompt tokens in its {num_requests} "
                f"entries; a batch may hold at most {self.max_waiting_tokens} "
                "(max_waiting_tokens: no more can wait at once)",
                param="prompt",
                code="too_many_tokens",
            )

    def check(self, num_prompt_tokens: int) -> None:
        """Raise a 503 ApiError if a request of ``num_prompt_tokens`` may not enter now."""
        full = self.num_waiting >= self.max_waiting_requests
        over_tokens = (
            self.num_waiting > 0
            and self.num_waiting_tokens + num_prompt_tokens > self.max_waiting_tokens
        )
        if not (full or over_tokens):
            return
        self.num_rejected += 1
        what = (
            f"{self.num_waiting} requests are waiting (max_waiting_requests)"
            if full
            else f"{self.num_waiting_tokens} prompt tokens are waiting (max_waiting_tokens)"
        )
        retry = self.retry_after()
        raise ApiError(
            503,
            f"the server is overloaded: {what}; retry after {retry} s",
            code="overloaded",
            headers=((b"retry-after", str(retry).encode()),),
        )

    @contextmanager
    def waiting(self, num_prompt_tokens: int) -> Iterator[_Ticket]:
        """Admit a request (or raise 503); it counts as waiting until ``ticket.started()``
        or the end of the block."""
        self.check(num_prompt_tokens)
        ticket = _Ticket(self, num_prompt_tokens)
        self.num_waiting += 1
        self.num_waiting_tokens += num_prompt_tokens
        try:
            yield ticket
        finally:
            ticket.leave(departed=False)


class _Ticket:
    def __init__(self, admission: Admission, num_prompt_tokens: int) -> None:
        self._admission = admission
        self._num_tokens = num_prompt_tokens
        self._left = False

    def started(self) -> None:
        """The request had its first step: it leaves the queue (counted in the drain rate)."""
        self.leave(departed=True)

    def leave(self, *, departed: bool) -> None:
        if self._left:
            return
        self._left = True
        admission = self._admission
        admission.num_waiting -= 1
        admission.num_waiting_tokens -= self._num_tokens
        if departed:
            admission._departures.append(time.monotonic())
