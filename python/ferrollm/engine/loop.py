"""The engine loop: a stepper on its own thread, a thread-safe inbox in, one hand-off per step out.

Both engines run on it: generation (`LLMEngine`, through `EngineStepper`) and embedding
(``engine/embed_async.py``). Other threads (the asyncio event loop) never touch the stepper:
they put ``add``/``abort`` commands in an inbox guarded by a condition variable. The loop's
thread drains the inbox, runs one step, and hands everything the step produced to the event
loop with a single ``call_soon_threadsafe``, so the event loop wakes once per step however
large the batch. With nothing to do the thread sleeps on the condition. A request whose
handling raises fails alone (the stepper turns it into a delivery); the thread carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from ferrollm.engine.engine import LLMEngine, StepError
from ferrollm.engine.outputs import RequestFailure, RequestOutput
from ferrollm.engine.request import EngineRequest

logger = logging.getLogger("ferrollm.engine")

#: What the event loop receives from generation: each step's outputs and failures, in order.
Delivery = RequestOutput | RequestFailure

Req = TypeVar("Req")
Key = TypeVar("Key")
Out = TypeVar("Out")
_Req_contra = TypeVar("_Req_contra", contravariant=True)
_StepperKey = TypeVar("_StepperKey")


class Stepper(Protocol[_Req_contra, _StepperKey, Out]):
    """What an `EngineLoop` drives: requests in, deliveries (outputs, failures) out. Only the
    loop's thread calls it, but for `watch_faults` (before the thread starts) and `stats`
    (once, when the loop is made)."""

    @property
    def fault(self) -> BaseException | None:
        """What broke the stepper for good (the loop then dies of it), or None."""

    def watch_faults(self, callback: Callable[[BaseException], None]) -> None:
        """Call ``callback(fault)`` (from any thread) when `fault` is set."""

    def add(self, request: _Req_contra) -> Out | None:
        """Queue ``request``; the delivery that fails it if it is refused."""

    def abort(self, key: _StepperKey) -> None:
        """End a request at the next step (a no-op if it already ended)."""

    def has_work(self) -> bool:
        """Whether a step has anything to do."""

    def step(self) -> list[Out]:
        """One step: its deliveries, in order. A failure of some requests is delivered to
        them; only what must end the loop raises."""

    def stats(self) -> dict[str, int]:
        """``Scheduler.stats()``-shaped counters."""

    def waiting_order(self) -> list[_StepperKey]:
        """The waiting requests' keys in the order they would start (empty where the stepper
        keeps no such queue)."""


#: Seconds the loop keeps publishing the waiting queue after `EngineLoop.queue_position` was
#: last asked (a client polls while it waits for its first token).
QUEUE_WATCH_S = 5.0


@dataclass(frozen=True)
class _Add(Generic[Req]):
    request: Req


@dataclass(frozen=True)
class _Abort(Generic[Key]):
    request_id: Key


class EngineLoop(Generic[Req, Key, Out]):
    """Runs a `Stepper` on a daemon thread; ``add``/``abort`` are safe from any thread.

    ``on_outputs(deliveries)`` is called on ``event_loop``, once per step that produced
    anything (the step's deliveries, in order); ``on_death(error)`` once, there too, if the
    thread dies of an exception that escaped the stepper. ``label`` names the thread in logs.
    """

    def __init__(
        self,
        stepper: Stepper[Req, Key, Out],
        event_loop: asyncio.AbstractEventLoop,
        on_outputs: Callable[[list[Out]], None],
        on_death: Callable[[BaseException], None] = lambda error: None,
        *,
        name: str = "ferrollm-engine",
        label: str = "the engine thread",
    ) -> None:
        self.stepper = stepper
        self._event_loop = event_loop
        self._on_outputs = on_outputs
        self._on_death = on_death
        self._label = label
        self._cond = threading.Condition()
        self._inbox: list[_Add[Req] | _Abort[Key]] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        #: The stepper's counters after the latest step (read by other threads: the
        #: stepper itself belongs to the loop's thread).
        self.stats: dict[str, int] = stepper.stats()
        #: ``time.monotonic()`` when the latest step finished (or the loop was made).
        self.last_step_time = time.monotonic()
        #: Each waiting request's place (1: next) after the latest step, published only while
        #: someone asks (`queue_position`): ordering a long queue every step costs.
        self._queue: dict[Key, int] = {}
        self._queue_wanted_until = 0.0
        stepper.watch_faults(self._wake)

    def start(self) -> None:
        """Start the loop's thread."""
        self._thread.start()

    def queue_position(self, key: Key) -> int | None:
        """From any thread: request ``key``'s place in the waiting queue (1: the next to
        start) as of the latest step, or None when it is not waiting. The loop publishes the
        queue for `QUEUE_WATCH_S` after each ask, so the first ask may find none yet."""
        self._queue_wanted_until = time.monotonic() + QUEUE_WATCH_S
        return self._queue.get(key)

    @property
    def is_running(self) -> bool:
        """Whether the loop's thread is alive."""
        return self._thread.is_alive()

    @property
    def has_failed(self) -> bool:
        """Whether the stepper broke for good (a tensor-parallel rank is gone): the thread is
        ending, though it may still be posting the failed step's errors."""
        return self.stepper.fault is not None

    def add(self, request: Req) -> None:
        """Queue a request for the next step; a rejection arrives as a delivery."""
        self._put(_Add(request))

    def abort(self, request_id: Key) -> None:
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
        """From any thread: the stepper broke for good (``stepper.fault``); the loop ends."""
        with self._cond:
            self._cond.notify()

    def _put(self, command: _Add[Req] | _Abort[Key]) -> None:
        with self._cond:
            self._inbox.append(command)
            self._cond.notify()

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as e:
            # Whatever killed the thread, its requests must not hang: every open stream
            # gets a clean error, and `on_death` lets the owner decide about the process.
            logger.critical("%s died: %r", self._label, e, exc_info=e)
            with self._cond:
                self._stopping = True
            self._post_death(e)

    def _post_death(self, error: BaseException) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody listens
            self._event_loop.call_soon_threadsafe(self._on_death, error)

    def _serve(self) -> None:
        stepper = self.stepper
        while (commands := self._wait_for_work()) is not None:
            deliveries = self._apply(commands)
            if stepper.has_work() and stepper.fault is None:
                deliveries += stepper.step()
                self.stats = stepper.stats()
                self.last_step_time = time.monotonic()
                self._publish_queue()
            if deliveries and not self._post(deliveries):
                return
            if stepper.fault is not None:
                # A tensor-parallel rank is gone: the step's requests got the error above,
                # and dying here fails every other open stream and ends the process.
                raise stepper.fault

    def _publish_queue(self) -> None:
        if time.monotonic() < self._queue_wanted_until:
            order = self.stepper.waiting_order()
            self._queue = {key: place for place, key in enumerate(order, start=1)}
        elif self._queue:
            self._queue = {}

    def _wait_for_work(self) -> list[_Add[Req] | _Abort[Key]] | None:
        """The inbox's commands, once there is anything to do; None when shutting down."""
        with self._cond:
            idle = False
            while not (
                self._stopping
                or self._inbox
                or self.stepper.has_work()
                or self.stepper.fault is not None
            ):
                idle = True
                self._cond.wait()
            if idle:  # progress is measured from when there is work again
                self.last_step_time = time.monotonic()
            if self._stopping:
                return None
            commands, self._inbox = self._inbox, []
            return commands

    def _apply(self, commands: list[_Add[Req] | _Abort[Key]]) -> list[Out]:
        failures: list[Out] = []
        for command in commands:
            if isinstance(command, _Abort):
                self.stepper.abort(command.request_id)
            elif (failure := self.stepper.add(command.request)) is not None:
                failures.append(failure)
        return failures

    def _post(self, deliveries: list[Out]) -> bool:
        try:
            self._event_loop.call_soon_threadsafe(self._on_outputs, deliveries)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            logger.warning("event loop closed; %s exits", self._label)
            return False
        return True


class EngineStepper:
    """An `LLMEngine` as a `Stepper`: a refused request fails alone, and so do the requests of
    a step that failed."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine

    @property
    def fault(self) -> BaseException | None:
        """What broke the engine for good (``LLMEngine.fault``), or None."""
        return self.engine.fault

    def watch_faults(self, callback: Callable[[BaseException], None]) -> None:
        """Call ``callback(fault)`` (from any thread) when `fault` is set."""
        self.engine.watch_faults(callback)

    def add(self, request: EngineRequest) -> Delivery | None:
        """Queue ``request``; its `RequestFailure` if the engine refuses it."""
        try:
            self.engine.add_request(request)
        except Exception as e:  # a bad request must not take the engine down
            logger.warning("request %s rejected: %s", request.request_id, e)
            return RequestFailure(request.request_id, e)
        return None

    def abort(self, key: str) -> None:
        """Abort request ``key`` at the next step."""
        self.engine.abort_request(key)

    def has_work(self) -> bool:
        """Whether any request is waiting or running."""
        return self.engine.has_unfinished_requests()

    def step(self) -> list[Delivery]:
        """One engine step's outputs; a failed step fails its requests."""
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

    def stats(self) -> dict[str, int]:
        """The engine's counters (``LLMEngine.stats``)."""
        return self.engine.stats()

    def waiting_order(self) -> list[str]:
        """The waiting requests' ids in the order they would start."""
        return self.engine.waiting_order()


#: The generation engine's loop.
GenerationLoop = EngineLoop[EngineRequest, str, Delivery]
