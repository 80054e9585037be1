"""The engine on its own thread: a thread-safe inbox in, one hand-off per step out.

Other threads (the asyncio event loop) never touch the engine: they put ``add``/``abort``
commands in an inbox guarded by a condition variable. The engine thread drains the inbox, runs
one step, and hands everything the step produced to the event loop with a single
``call_soon_threadsafe``, so the event loop wakes once per step however large the batch. With
nothing to do the thread sleeps on the condition. A request whose handling raises fails alone
(a `RequestFailure` goes to its stream, the error is logged); the thread carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ferrollm.engine.engine import LLMEngine, StepError
from ferrollm.engine.outputs import RequestFailure, RequestOutput
from ferrollm.engine.request import EngineRequest

logger = logging.getLogger("ferrollm.engine")

#: What the event loop receives: each step's outputs and failures, in order.
Delivery = RequestOutput | RequestFailure


@dataclass(frozen=True)
class _Add:
    request: EngineRequest


@dataclass(frozen=True)
class _Abort:
    request_id: str


class EngineLoop:
    """Runs an `LLMEngine` on a daemon thread; ``add``/``abort`` are safe from any thread.

    ``on_outputs(deliveries)`` is called on ``event_loop``, once per step that produced
    anything (outputs and failures of that step, in order); ``on_death(error)`` once, there
    too, if the thread dies of an exception that escaped the per-request handling.
    """

    def __init__(
        self,
        engine: LLMEngine,
        event_loop: asyncio.AbstractEventLoop,
        on_outputs: Callable[[list[Delivery]], None],
        on_death: Callable[[BaseException], None] = lambda error: None,
    ) -> None:
        self.engine = engine
        self._event_loop = event_loop
        self._on_outputs = on_outputs
        self._on_death = on_death
        self._cond = threading.Condition()
        self._inbox: list[_Add | _Abort] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="ferrollm-engine", daemon=True)
        #: The scheduler's counters after the latest step (read by other threads: the
        #: scheduler itself belongs to the engine thread).
        self.stats: dict[str, int] = engine.scheduler.stats()
        #: ``time.monotonic()`` when the latest step finished (or the loop was made).
        self.last_step_time = time.monotonic()
        engine.watch_faults(self._wake)

    def start(self) -> None:
        """Start the engine thread."""
        self._thread.start()

    @property
    def is_running(self) -> bool:
        """Whether the engine thread is alive."""
        return self._thread.is_alive()

    def add(self, request: EngineRequest) -> None:
        """Queue a request for the next step; a rejection arrives as a `RequestFailure`."""
        self._put(_Add(request))

    def abort(self, request_id: str) -> None:
        """Abort a request at the next step (a no-op if it already ended)."""
        self._put(_Abort(request_id))

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop after the current step and wait for the thread; unfinished work is dropped."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _wake(self, fault: BaseException) -> None:
        """From any thread: the engine broke for good (``engine.fault``); the loop ends."""
        with self._cond:
            self._cond.notify()

    def _put(self, command: _Add | _Abort) -> None:
        with self._cond:
            self._inbox.append(command)
            self._cond.notify()

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as e:
            # Whatever killed the thread, its requests must not hang: every open stream
            # gets a clean error, and `on_death` lets the owner decide about the process.
            logger.critical("the engine thread died: %r", e, exc_info=e)
            with self._cond:
                self._stopping = True
            self._post_death(e)

    def _post_death(self, error: BaseException) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody listens
            self._event_loop.call_soon_threadsafe(self._on_death, error)

    def _serve(self) -> None:
        while (commands := self._wait_for_work()) is not None:
            deliveries = self._apply(commands)
            if self.engine.has_unfinished_requests() and self.engine.fault is None:
                deliveries += self._step()
                self.stats = self.engine.scheduler.stats()
                self.last_step_time = time.monotonic()
            if deliveries and not self._post(deliveries):
                return
            if self.engine.fault is not None:
                # A tensor-parallel rank is gone: the step's requests got the error above,
                # and dying here fails every other open stream and ends the process.
                raise self.engine.fault

    def _wait_for_work(self) -> list[_Add | _Abort] | None:
        """The inbox's commands, once there is anything to do; None when shutting down."""
        with self._cond:
            idle = False
            while not (
                self._stopping
                or self._inbox
                or self.engine.has_unfinished_requests()
                or self.engine.fault is not None
            ):
                idle = True
                self._cond.wait()
            if idle:  # progress is measured from when there is work again
                self.last_step_time = time.monotonic()
            if self._stopping:
                return None
            commands, self._inbox = self._inbox, []
            return commands

    def _apply(self, commands: list[_Add | _Abort]) -> list[Delivery]:
        failures: list[Delivery] = []
        for command in commands:
            if isinstance(command, _Abort):
                self.engine.abort_request(command.request_id)
                continue
            request_id = command.request.request_id
            try:
                self.engine.add_request(command.request)
            except Exception as e:  # a bad request must not take the engine down
                logger.warning("request %s rejected: %s", request_id, e)
                failures.append(RequestFailure(request_id, e))
        return failures

    def _step(self) -> list[Delivery]:
        try:
            return self.engine.step()
        except StepError as e:  # logged by the engine
            return [RequestFailure(request_id, e) for request_id in e.request_ids]
        except Exception as e:
            # A bug past the model call: the tracked state may be half-updated, so end
            # everything rather than deliver wrong text.
            logger.exception("engine step failed unexpectedly; failing all requests")
            request_ids = self.engine.abort_all()
            return [RequestFailure(request_id, e) for request_id in request_ids]

    def _post(self, deliveries: list[Delivery]) -> bool:
        try:
            self._event_loop.call_soon_threadsafe(self._on_outputs, deliveries)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            logger.warning("event loop closed; engine thread exits")
            return False
        return True
