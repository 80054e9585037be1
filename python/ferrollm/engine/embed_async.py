"""`AsyncEmbedder`: the embedding engine on the engine loop, for the server.

It runs on the same `EngineLoop` as generation (``engine/loop.py``): the loop's thread owns a
prefill-only Rust scheduler (see ``engine/embed.py``), and only it touches the scheduler.
Requests hand their inputs over through the loop's inbox (one scheduler request per input, all
with the request's arrival time, on generation's clock: ``time.perf_counter()``); each step the
scheduler packs waiting inputs, across requests and in arrival order, up to the token budget
and the seats; the thread runs the one packed forward, and the step's finished requests get
their vectors on the event loop, with one hand-off per step. A request whose client went away
has its waiting inputs aborted. Past ``max_num_waiting`` queued inputs a request is refused
(503). Everything but the counters (`stats`) belongs to the one event loop that first used it.

If the thread dies (anything escaping a step), every request in flight or queued fails with
``EngineDeadError``, new requests are refused, ``is_running`` turns false (readiness 503) and
``on_death`` tells the server, which exits non-zero (``server/guard.py``), as it does when the
generation engine dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ferrollm._core import NewRequest, PrefillScheduler, QueueFullError, StepPlan
from ferrollm.config import EngineConfig
from ferrollm.engine.async_engine import EngineDeadError
from ferrollm.engine.embed import Embedder, embed_scheduler_config
from ferrollm.engine.loop import EngineLoop

logger = logging.getLogger("ferrollm.engine")


@dataclass(eq=False)
class _Job:
    inputs: Sequence[Sequence[int]]
    future: asyncio.Future[np.ndarray]
    out: np.ndarray
    #: ``time.perf_counter()``, as `EngineRequest.arrival_time`: the clock both schedulers
    #: plan steps on (``schedule(now)``), so that arrival order, priority aging and deadlines
    #: mean the same for both engines.
    arrival: float = field(default_factory=time.perf_counter)
    #: Scheduler request ids of its inputs (set on the thread when they are added).
    req_ids: list[int] = field(default_factory=list)
    num_done: int = 0
    cancelled: bool = False


#: What the event loop receives: a request and its vectors, or the error that failed it.
_Delivery = tuple[_Job, np.ndarray | BaseException]


@dataclass
class _Counters:
    num_steps: int = 0
    num_inputs: int = 0
    num_tokens: int = 0
    num_waiting: int = 0
    num_running: int = 0


class AsyncEmbedder:
    """Embeds token-id inputs on a background thread; ``await embed(inputs)`` -> float32
    ``[len(inputs), dimensions]``."""

    task = "embed"

    def __init__(self, embedder: Embedder, max_num_waiting: int = 4096) -> None:
        self.embedder = embedder
        self.max_num_waiting = max_num_waiting
        #: ``on_death(cause)`` runs on the event loop once the thread has died (``watch``).
        self.on_death: Callable[[BaseException], None] | None = None
        self._steps = _EmbedSteps(embedder, max_num_waiting)
        self._loop: EngineLoop[_Job, _Job, _Delivery] | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        #: Requests awaiting their vectors (`fail_in_flight`, and a death fails them).
        self._jobs: set[_Job] = set()
        self._closed = False
        self._dead: BaseException | None = None

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncEmbedder:
        """Load the encoder ``config`` names (None: the default embedding model)."""
        embedder = Embedder.from_path(
            config.model,
            device=config.device,
            dtype=config.dtype,
            pooling=config.pooling,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs,
        )
        return cls(embedder, config.max_num_waiting)

    @property
    def model_path(self) -> Path | None:
        """The model directory (its name is the default served name)."""
        return self.embedder.model_path

    async def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """The inputs' embeddings, in order. Raises QueueFullError past ``max_num_waiting``
        and EngineDeadError once the thread has died or shut down."""
        if not inputs:
            return np.empty((0, 0), np.float32)
        engine_loop = self._start()
        self._steps.reserve(len(inputs))  # QueueFullError: nothing was queued
        out = np.empty((len(inputs), self.embedder.dimensions), np.float32)
        job = _Job(inputs, asyncio.get_running_loop().create_future(), out)
        self._jobs.add(job)
        engine_loop.add(job)
        try:
            return await job.future
        except asyncio.CancelledError:
            job.cancelled = True
            engine_loop.abort(job)
            raise
        finally:
            self._jobs.discard(job)

    def watch(self, on_death: Callable[[BaseException], None]) -> None:
        """Call ``on_death(cause)`` on the running event loop when the thread dies (at once
        if it already has)."""
        self.on_death = on_death
        if self._dead is not None:
            asyncio.get_running_loop().call_soon(on_death, self._dead)
        elif not self._closed:
            self._start()

    def stats(self) -> dict[str, int]:
        """``Scheduler.stats()``-shaped counters (KV blocks live for one step only: 0)."""
        return self._steps.stats()

    @property
    def is_running(self) -> bool:
        """Not shut down, and the thread (once started) alive."""
        return not self._closed and (self._loop is None or self._loop.is_running)

    def seconds_since_progress(self) -> float:
        """Seconds since the last finished step while inputs wait, else 0."""
        if self._loop is None or not self._steps.counters.num_waiting:
            return 0.0
        return time.monotonic() - self._loop.last_step_time

    def fail_in_flight(self, error: Exception) -> int:
        """On the event loop: fail every request waiting or running with ``error`` (the thread
        aborts their inputs, as for a cancelled request); how many there were."""
        jobs = [job for job in self._jobs if not job.future.done()]
        for job in jobs:
            job.cancelled = True
            if self._loop is not None:
                self._loop.abort(job)
            job.future.set_exception(error)
        return len(jobs)

    def shutdown(self) -> None:
        """Stop the thread; queued requests fail."""
        self._closed = True
        if self._loop is not None:
            self._loop.shutdown(timeout=30)
        if self._loop is None or not self._loop.is_running:  # else stuck in a forward
            self._steps.forget_waiting()
        event_loop = self._event_loop
        if event_loop is not None and not event_loop.is_closed():
            # On the event loop: `_jobs` belongs to it, and this may be another thread.
            with contextlib.suppress(RuntimeError):  # it closed meanwhile: nobody waits
                event_loop.call_soon_threadsafe(self._fail_open, self._why_closed())

    def _why_closed(self) -> str:
        if self._dead is not None:
            return f"the embedding engine stopped: {self._dead!r}"
        return "the embedding engine has shut down"

    def _start(self) -> EngineLoop[_Job, _Job, _Delivery]:
        if self._closed:
            raise EngineDeadError(self._why_closed())
        event_loop = asyncio.get_running_loop()
        if self._loop is None:
            self._event_loop = event_loop
            self._loop = EngineLoop(
                self._steps,
                event_loop,
                self._deliver,
                self._died,
                name="ferrollm-embed",
                label="the embedding thread",
            )
            self._loop.start()
        elif event_loop is not self._event_loop:
            raise RuntimeError("an AsyncEmbedder serves the one event loop that first used it")
        return self._loop

    def _deliver(self, deliveries: list[_Delivery]) -> None:
        """On the event loop: one step's vectors and failures to their requests."""
        for job, value in deliveries:
            if job.future.done():  # cancelled, or failed by `fail_in_flight`
                continue
            if isinstance(value, BaseException):
                job.future.set_exception(value)
            else:
                job.future.set_result(value)

    def _died(self, cause: BaseException) -> None:
        """On the event loop: the thread died; nothing more can be served."""
        self._closed = True
        self._dead = cause
        self._steps.forget_waiting()
        self._fail_open(self._why_closed())
        if self.on_death is not None:
            self.on_death(cause)

    def _fail_open(self, why: str) -> None:
        self._deliver([(job, EngineDeadError(why)) for job in self._jobs])


class _EmbedSteps:
    """The embedder as the loop's `Stepper`: scheduler, rows and forward are the thread's;
    the counters are shared (``reserve`` on the event loop, ``stats`` anywhere)."""

    #: An embedder has no worker processes whose loss breaks it for good.
    fault: BaseException | None = None

    def __init__(self, embedder: Embedder, max_num_waiting: int) -> None:
        self.embedder = embedder
        self.max_num_waiting = max_num_waiting
        self.scheduler = PrefillScheduler(
            embed_scheduler_config(
                embedder.max_num_batched_tokens,
                embedder.max_num_seqs,
                embedder.max_input_tokens,
                max_num_waiting,
            )
        )
        self.counters = _Counters()
        self._lock = threading.Lock()  # guards `counters.num_waiting`
        self._rows: dict[int, tuple[_Job, int]] = {}
        self._next_id = 0

    def watch_faults(self, callback: Callable[[BaseException], None]) -> None:
        """Nothing to watch (see `fault`)."""

    def reserve(self, num_inputs: int) -> None:
        """Count ``num_inputs`` more waiting, or raise QueueFullError past the limit."""
        with self._lock:
            num_waiting = self.counters.num_waiting
            if num_waiting + num_inputs > self.max_num_waiting:
                raise QueueFullError(
                    f"the embedding queue is full ({num_waiting} inputs waiting, "
                    f"at most {self.max_num_waiting}); retry later"
                )
            self.counters.num_waiting += num_inputs

    def forget_waiting(self) -> None:
        """Once the thread has stopped: nothing waits any more."""
        with self._lock:
            self.counters.num_waiting = 0

    def _release(self, num_inputs: int) -> None:
        with self._lock:
            self.counters.num_waiting -= num_inputs

    def add(self, job: _Job) -> _Delivery | None:
        """Queue the job's inputs; the error that fails it if one is refused."""
        if job.cancelled:  # gone before it reached the thread
            self._release(len(job.inputs))
            return None
        for i, ids in enumerate(job.inputs):
            req_id = self._next_id
            try:
                self.scheduler.add_request(NewRequest(req_id, ids, arrival_time=job.arrival))
            except (ValueError, QueueFullError) as e:  # a refused input fails its request alone
                self._release(len(job.inputs) - i)
                job.cancelled = True
                self.abort(job)
                return (job, e)
            self._next_id += 1
            job.req_ids.append(req_id)
            self._rows[req_id] = (job, i)
        return None

    def abort(self, job: _Job) -> None:
        """Abort the job's inputs that have not run."""
        for req_id in job.req_ids:
            if req_id in self._rows:
                self.scheduler.abort_request(req_id)

    def has_work(self) -> bool:
        """Whether any input waits or runs."""
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[_Delivery]:
        """One packed forward; the requests it finished or failed."""
        plan = self.scheduler.schedule(time.perf_counter())
        c = self.counters
        for req_id in plan.finished_req_ids.tolist():  # aborted before they ran
            self._rows.pop(req_id, None)
        self._release(plan.num_rows + len(plan.finished_req_ids))
        # Rows stay in `_rows` through the forward, so that a failure aborts the rest of
        # their requests' inputs.
        req_ids = plan.req_ids.tolist()
        rows = [self._rows[req_id] for req_id in req_ids]
        c.num_running = plan.num_rows
        try:
            vectors, deliveries = self._forward(plan, rows)
        finally:
            self.scheduler.update(plan, [])
            c.num_running = 0
        for req_id in req_ids:
            del self._rows[req_id]
        if vectors is not None:
            for (job, i), vector in zip(rows, vectors, strict=True):
                job.out[i] = vector
                job.num_done += 1
                if job.num_done == len(job.inputs):
                    deliveries.append((job, job.out))
        c.num_steps += 1
        c.num_inputs += plan.num_rows
        c.num_tokens += plan.num_scheduled_tokens
        return deliveries

    def _forward(
        self, plan: StepPlan, rows: list[tuple[_Job, int]]
    ) -> tuple[np.ndarray | None, list[_Delivery]]:
        """The step's vectors, or None and the failures of its requests when the forward
        failed (they fail alone)."""
        if not rows:
            return None, []
        try:
            return self.embedder.run_plan(plan), []
        except Exception as e:  # fail this step's requests, keep serving the others
            logger.exception("embedding step failed")
            jobs = list(dict.fromkeys(job for job, _ in rows))
            for job in jobs:
                job.cancelled = True
                self.abort(job)
            return None, [(job, e) for job in jobs]

    def waiting_order(self) -> list[_Job]:
        """No queue positions: an embedding input runs within a step or two of arriving."""
        return []

    def stats(self) -> dict[str, int]:
        """``Scheduler.stats()``-shaped counters (KV blocks live for one step only: 0)."""
        c = self.counters
        return {
            "num_running_seqs": c.num_running,
            "num_waiting_seqs": c.num_waiting,
            "num_used_blocks": 0,
            "num_free_blocks": 0,
            "num_cached_blocks": 0,
            "num_prefix_queried_blocks": 0,
            "num_prefix_hit_blocks": 0,
            "num_preemptions": 0,
            "num_steps": c.num_steps,
        }
