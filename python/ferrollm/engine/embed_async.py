"""`AsyncEmbedder`: the embedding engine on its own thread, for the server.

The thread owns a prefill-only Rust scheduler (see ``engine/embed.py``); only it touches the
scheduler. Requests hand their inputs over through an inbox (one scheduler request per input,
all with the request's arrival time); each step the scheduler packs waiting inputs, across
requests and in arrival order, up to the token budget and the seats; the thread runs the one
packed forward and hands each request its vectors once all of its inputs are done. A request
whose client went away has its waiting inputs aborted. Past ``max_num_waiting`` queued inputs a
request is refused (503).

If the thread dies (anything escaping its loop), every request in flight or queued fails with
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
from typing import Any

import numpy as np

from ferrollm._core import NewRequest, PrefillScheduler, QueueFullError, StepPlan
from ferrollm.config import EngineConfig
from ferrollm.engine.async_engine import EngineDeadError
from ferrollm.engine.embed import Embedder, embed_scheduler_config

logger = logging.getLogger("ferrollm.engine")


@dataclass(eq=False)
class _Job:
    inputs: Sequence[Sequence[int]]
    future: asyncio.Future[np.ndarray]
    loop: asyncio.AbstractEventLoop
    out: np.ndarray
    arrival: float = field(default_factory=time.time)
    #: Scheduler request ids of its inputs (set on the thread when they are added).
    req_ids: list[int] = field(default_factory=list)
    num_done: int = 0
    cancelled: bool = False


@dataclass
class _Counters:
    num_steps: int = 0
    num_inputs: int = 0
    num_tokens: int = 0
    num_waiting: int = 0
    num_running: int = 0
    last_step_time: float = field(default_factory=time.monotonic)


class AsyncEmbedder:
    """Embeds token-id inputs on a background thread; ``await embed(inputs)`` -> float32
    ``[len(inputs), dimensions]``."""

    task = "embed"

    def __init__(self, embedder: Embedder, max_num_waiting: int = 4096) -> None:
        self.embedder = embedder
        self.max_num_waiting = max_num_waiting
        #: ``on_death(cause)`` runs on ``_event_loop`` once the thread has died (``watch``).
        self.on_death: Callable[[BaseException], None] | None = None
        self._scheduler = PrefillScheduler(
            embed_scheduler_config(
                embedder.max_num_batched_tokens,
                embedder.max_num_seqs,
                embedder.max_input_tokens,
                max_num_waiting,
            )
        )
        self._inbox: list[tuple[str, _Job]] = []
        #: Requests awaiting their vectors (the event loop's view; `fail_in_flight`).
        self._jobs: set[_Job] = set()
        self._rows: dict[int, tuple[_Job, int]] = {}
        self._next_id = 0
        self._wake = threading.Condition()
        self._counters = _Counters()
        self._closed = False
        self._dead: BaseException | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="ferrollm-embed", daemon=True)
        self._thread.start()

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
        loop = asyncio.get_running_loop()
        job = _Job(inputs, loop.create_future(), loop, np.empty((len(inputs), 0), np.float32))
        if not inputs:
            return job.out
        with self._wake:
            if self._closed:
                raise EngineDeadError(self._why_closed())
            if self._counters.num_waiting + len(inputs) > self.max_num_waiting:
                raise QueueFullError(
                    f"the embedding queue is full ({self._counters.num_waiting} inputs waiting, "
                    f"at most {self.max_num_waiting}); retry later"
                )
            job.out = np.empty((len(inputs), self.embedder.dimensions), np.float32)
            self._inbox.append(("add", job))
            self._counters.num_waiting += len(inputs)
            self._wake.notify()
        self._jobs.add(job)
        try:
            return await job.future
        except asyncio.CancelledError:
            with self._wake:
                job.cancelled = True
                self._inbox.append(("abort", job))
                self._wake.notify()
            raise
        finally:
            self._jobs.discard(job)

    def watch(self, on_death: Callable[[BaseException], None]) -> None:
        """Call ``on_death(cause)`` on the running event loop when the thread dies (at once
        if it already has)."""
        with self._wake:
            self._event_loop = asyncio.get_running_loop()
            self.on_death = on_death
            dead = self._dead
        if dead is not None:
            self._post_death(dead)

    def stats(self) -> dict[str, int]:
        """``Scheduler.stats()``-shaped counters (KV blocks live for one step only: 0)."""
        c = self._counters
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

    @property
    def is_running(self) -> bool:
        """Not shut down and the thread alive."""
        return not self._closed and self._thread.is_alive()

    def seconds_since_progress(self) -> float:
        """Seconds since the last finished step while inputs wait, else 0."""
        if not self._counters.num_waiting:
            return 0.0
        return time.monotonic() - self._counters.last_step_time

    def fail_in_flight(self, error: Exception) -> int:
        """On the event loop: fail every request waiting or running with ``error`` (the thread
        aborts their inputs, as for a cancelled request); how many there were."""
        jobs = [job for job in self._jobs if not job.future.done()]
        with self._wake:
            for job in jobs:
                job.cancelled = True
                self._inbox.append(("abort", job))
            self._wake.notify()
        for job in jobs:
            _set_exception(job.future, error)
        return len(jobs)

    def shutdown(self) -> None:
        """Stop the thread; queued requests fail."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=30)

    def _why_closed(self) -> str:
        if self._dead is not None:
            return f"the embedding engine stopped: {self._dead!r}"
        return "the embedding engine has shut down"

    # ---- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while (commands := self._wait_for_work()) is not None:
                self._apply(commands)
                if self._scheduler.has_unfinished_requests():
                    self._step()
        except BaseException as e:
            # Whatever killed the thread, its requests must not hang: each gets a clean
            # error, and `on_death` lets the server decide about the process.
            logger.critical("the embedding thread died: %r", e, exc_info=e)
            with self._wake:
                self._closed = True
                self._dead = e
            self._fail_all(EngineDeadError(self._why_closed()))
            self._post_death(e)
            return
        self._fail_all(EngineDeadError(self._why_closed()))

    def _wait_for_work(self) -> list[tuple[str, _Job]] | None:
        """The inbox's commands (None: shut down), waiting while there is nothing to do."""
        with self._wake:
            while not (self._closed or self._inbox or self._scheduler.has_unfinished_requests()):
                self._wake.wait()
            if self._closed:
                return None
            commands, self._inbox = self._inbox, []
            return commands

    def _apply(self, commands: list[tuple[str, _Job]]) -> None:
        for kind, job in commands:
            if kind == "abort":
                self._abort(job)
            elif job.cancelled:
                self._counters.num_waiting -= len(job.inputs)
            else:
                self._add(job)

    def _add(self, job: _Job) -> None:
        for i, ids in enumerate(job.inputs):
            req_id = self._next_id
            try:
                self._scheduler.add_request(NewRequest(req_id, ids, arrival_time=job.arrival))
            except (ValueError, QueueFullError) as e:  # a refused input fails its request alone
                self._counters.num_waiting -= len(job.inputs) - i
                job.cancelled = True
                self._abort(job)
                _deliver(job, _set_exception, e)
                return
            self._next_id += 1
            job.req_ids.append(req_id)
            self._rows[req_id] = (job, i)

    def _abort(self, job: _Job) -> None:
        for req_id in job.req_ids:
            if req_id in self._rows:
                self._scheduler.abort_request(req_id)

    def _step(self) -> None:
        plan = self._scheduler.schedule(time.time())
        c = self._counters
        for req_id in plan.finished_req_ids.tolist():  # aborted before they ran
            self._rows.pop(req_id, None)
        c.num_waiting -= plan.num_rows + len(plan.finished_req_ids)
        # Rows stay in `_rows` until delivered, so that a death mid-step fails them too.
        req_ids = plan.req_ids.tolist()
        rows = [self._rows[req_id] for req_id in req_ids]
        c.num_running = plan.num_rows
        try:
            vectors = self._forward(plan, rows)
        finally:
            self._scheduler.update(plan, [])
            c.num_running = 0
        for req_id in req_ids:
            del self._rows[req_id]
        if vectors is not None:
            for (job, i), vector in zip(rows, vectors, strict=True):
                job.out[i] = vector
                job.num_done += 1
                if job.num_done == len(job.inputs):
                    _deliver(job, _set_result, job.out)
        c.num_steps += 1
        c.num_inputs += plan.num_rows
        c.num_tokens += plan.num_scheduled_tokens
        c.last_step_time = time.monotonic()

    def _forward(self, plan: StepPlan, rows: list[tuple[_Job, int]]) -> np.ndarray | None:
        """The step's vectors; None when the forward failed (its requests failed alone)."""
        if not rows:
            return None
        try:
            return self.embedder.run_plan(plan)
        except Exception as e:  # fail this step's requests, keep serving the others
            logger.exception("embedding step failed")
            for job in {job for job, _ in rows}:
                job.cancelled = True
                self._abort(job)
                _deliver(job, _set_exception, e)
            return None

    def _fail_all(self, error: EngineDeadError) -> None:
        with self._wake:
            jobs = {job for _, job in self._inbox} | {job for job, _ in self._rows.values()}
            self._inbox.clear()
            self._rows.clear()
            self._counters.num_waiting = 0
        for job in jobs:
            _deliver(job, _set_exception, error)

    def _post_death(self, cause: BaseException) -> None:
        if self.on_death is None or self._event_loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody listens
            self._event_loop.call_soon_threadsafe(self.on_death, cause)


def _deliver(job: _Job, fn: Callable[[asyncio.Future[np.ndarray], Any], None], value: Any) -> None:
    # A closed event loop raises RuntimeError: nobody is waiting for this request any more.
    with contextlib.suppress(RuntimeError):
        job.loop.call_soon_threadsafe(fn, job.future, value)


def _set_result(future: asyncio.Future[np.ndarray], value: np.ndarray) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[np.ndarray], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
