"""`AsyncEmbedder`: the embedding engine on its own thread, for the server.

Requests queue their inputs; the thread takes inputs from the front of the queue, across
requests, until the step's token budget (``max_num_batched_tokens``) or seat count
(``max_num_seqs``) is spent, runs one packed forward, and hands each request its vectors once
all of its inputs are done. A request whose client went away is dropped before its next
input is packed. Past ``max_num_waiting`` queued inputs a request is refused (503).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ferrollm._core import QueueFullError
from ferrollm.config import EngineConfig
from ferrollm.engine.embed import Embedder

logger = logging.getLogger("ferrollm.engine")


@dataclass(eq=False)
class _Job:
    inputs: Sequence[Sequence[int]]
    future: asyncio.Future[np.ndarray]
    loop: asyncio.AbstractEventLoop
    out: np.ndarray
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
        self._queue: collections.deque[tuple[_Job, int]] = collections.deque()
        self._wake = threading.Condition()
        self._counters = _Counters()
        self._closed = False
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
        """The inputs' embeddings, in order. Raises QueueFullError past ``max_num_waiting``."""
        loop = asyncio.get_running_loop()
        job = _Job(inputs, loop.create_future(), loop, np.empty((len(inputs), 0), np.float32))
        if not inputs:
            return job.out
        with self._wake:
            if self._closed:
                raise RuntimeError("the embedding engine has shut down")
            if self._counters.num_waiting + len(inputs) > self.max_num_waiting:
                raise QueueFullError(
                    f"the embedding queue is full ({self._counters.num_waiting} inputs waiting, "
                    f"at most {self.max_num_waiting}); retry later"
                )
            job.out = np.empty((len(inputs), self.embedder.dimensions), np.float32)
            self._queue.extend((job, i) for i in range(len(inputs)))
            self._counters.num_waiting += len(inputs)
            self._wake.notify()
        try:
            return await job.future
        except asyncio.CancelledError:
            job.cancelled = True  # the thread drops its inputs still queued
            raise

    def stats(self) -> dict[str, int]:
        """``Scheduler.stats()``-shaped counters (no KV cache: those are 0)."""
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

    def shutdown(self) -> None:
        """Stop the thread; queued requests fail."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=30)

    def _take_step(self) -> list[tuple[_Job, int]] | None:
        """The next step's inputs (None: shut down), waiting for work."""
        budget, seats = self.embedder.max_num_batched_tokens, self.embedder.max_num_seqs
        with self._wake:
            while not self._queue and not self._closed:
                self._wake.wait()
            if self._closed:
                return None
            step: list[tuple[_Job, int]] = []
            tokens = 0
            while self._queue and len(step) < seats:
                job, i = self._queue[0]
                n = len(job.inputs[i])
                if step and tokens + n > budget:
                    break
                self._queue.popleft()
                self._counters.num_waiting -= 1
                if not job.cancelled:
                    step.append((job, i))
                    tokens += n
            self._counters.num_running = len(step)
            return step

    def _run(self) -> None:
        while (step := self._take_step()) is not None:
            if step:
                self._run_step(step)
        self._fail_queued()

    def _run_step(self, step: list[tuple[_Job, int]]) -> None:
        try:
            vectors = self.embedder.run_step([job.inputs[i] for job, i in step])
        except Exception as e:  # fail this step's requests, keep serving the others
            logger.exception("embedding step failed")
            for job in {job for job, _ in step}:
                job.cancelled = True
                _deliver(job, _set_exception, e)
        else:
            for (job, i), vector in zip(step, vectors, strict=True):
                job.out[i] = vector
                job.num_done += 1
                if job.num_done == len(job.inputs):
                    _deliver(job, _set_result, job.out)
        c = self._counters
        c.num_steps += 1
        c.num_inputs += len(step)
        c.num_tokens += sum(len(job.inputs[i]) for job, i in step)
        c.num_running = 0
        c.last_step_time = time.monotonic()

    def _fail_queued(self) -> None:
        with self._wake:
            jobs = {job for job, _ in self._queue}
            self._queue.clear()
        for job in jobs:
            error = RuntimeError("the embedding engine shut down")
            _deliver(job, _set_exception, error)


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
