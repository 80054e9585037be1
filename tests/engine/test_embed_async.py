"""`AsyncEmbedder` over a fake encoder: packing across requests, cancellation, shutdown, the
death of its thread, and the clock its scheduler runs on (the generation engine's)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from ferrollm.engine.async_engine import EngineDeadError
from ferrollm.engine.embed_async import AsyncEmbedder


class _GatedEmbedder:
    """Just what ``AsyncEmbedder`` reads of an ``Embedder``; its first step waits for a gate,
    so the test can queue requests behind it. Each vector is [input length, step number]; an
    input starting with token 999 fails its step."""

    dimensions = 2
    max_num_batched_tokens = 10
    max_input_tokens = 10
    max_num_seqs = 4

    def __init__(self) -> None:
        import threading

        self.gate = threading.Event()
        self.steps: list[list[int]] = []

    def run_plan(self, plan: Any) -> np.ndarray:
        if not self.steps:
            self.gate.wait(10)
        lengths = np.diff(plan.cu_seqlens_q).tolist()
        self.steps.append(lengths)
        if 999 in plan.input_ids[plan.cu_seqlens_q[:-1]]:
            raise RuntimeError("bad input")
        return np.array([[n, len(self.steps)] for n in lengths], dtype=np.float32)


async def _running(engine: AsyncEmbedder, inputs: list[list[int]]) -> asyncio.Future[Any]:
    """``inputs`` embedded in the background, once the engine thread is inside their step."""
    future = asyncio.ensure_future(engine.embed(inputs))
    while engine.stats()["num_running_seqs"] == 0:
        await asyncio.sleep(0.001)
    return future


def test_async_embedder_packs_across_requests_by_the_budget() -> None:
    fake = _GatedEmbedder()
    engine = AsyncEmbedder(fake, max_num_waiting=8)  # type: ignore[arg-type]

    async def go() -> list[object]:
        first = await _running(engine, [[1]])
        rest = [engine.embed([[1] * 3, [1] * 3]), engine.embed([[1] * 5]), engine.embed([[999]])]
        tasks = [asyncio.ensure_future(r) for r in rest]
        await asyncio.sleep(0.05)
        with pytest.raises(QueueFullError, match="queue is full"):
            await engine.embed([[1]] * 5)  # 4 waiting + 5 > 8
        fake.gate.set()
        return await asyncio.gather(first, *tasks, return_exceptions=True)

    from ferrollm._core import QueueFullError

    try:
        results = asyncio.run(go())
    finally:
        engine.shutdown()
    # Step 2 packs the second request's two inputs (6 tokens) but not the 5-token one.
    assert fake.steps == [[1], [3, 3], [5, 1]]
    np.testing.assert_array_equal(results[0], [[1, 1]])
    np.testing.assert_array_equal(results[1], [[3, 2], [3, 2]])
    # A failed step fails its requests only: the 5-token input shared the step that failed.
    assert isinstance(results[2], RuntimeError) and isinstance(results[3], RuntimeError)
    assert not engine.is_running


def test_a_cancelled_request_gives_back_its_waiting_inputs() -> None:
    fake = _GatedEmbedder()
    engine = AsyncEmbedder(fake, max_num_waiting=8)  # type: ignore[arg-type]

    async def go() -> None:
        first = await _running(engine, [[1]])
        queued = asyncio.ensure_future(engine.embed([[1] * 3, [1] * 3]))
        while engine.stats()["num_waiting_seqs"] < 2:
            await asyncio.sleep(0.001)
        queued.cancel()
        # The cancellation runs (and queues the abort) at the task's next turn; only then
        # may the running step end, or the thread could schedule the inputs first.
        await asyncio.wait([queued])
        fake.gate.set()
        np.testing.assert_array_equal(await first, [[1, 1]])
        with pytest.raises(asyncio.CancelledError):
            await queued
        while engine.stats()["num_waiting_seqs"]:  # the thread drops the aborted inputs
            await asyncio.sleep(0.001)
        np.testing.assert_array_equal(await engine.embed([[1] * 2]), [[2, 2]])

    try:
        asyncio.run(go())
    finally:
        engine.shutdown()
    assert fake.steps == [[1], [2]]  # the cancelled inputs never ran
    assert engine.stats()["num_waiting_seqs"] == 0


def test_shutdown_finishes_the_running_step_and_fails_what_waits() -> None:
    fake = _GatedEmbedder()
    engine = AsyncEmbedder(fake, max_num_waiting=8)  # type: ignore[arg-type]

    async def go() -> list[object]:
        first = await _running(engine, [[1]])
        queued = asyncio.ensure_future(engine.embed([[1] * 3]))
        while engine.stats()["num_waiting_seqs"] < 1:
            await asyncio.sleep(0.001)
        stopping = asyncio.ensure_future(asyncio.to_thread(engine.shutdown))
        while engine.is_running:
            await asyncio.sleep(0.001)
        fake.gate.set()
        await stopping
        results = await asyncio.gather(first, queued, return_exceptions=True)
        with pytest.raises(EngineDeadError, match="shut down"):
            await engine.embed([[1]])
        return results

    first, queued = asyncio.run(go())
    np.testing.assert_array_equal(first, [[1, 1]])
    assert isinstance(queued, EngineDeadError) and "shut down" in str(queued)
    assert fake.steps == [[1]]
    assert not engine.is_running


class _RecordingScheduler:
    """A scheduler that records the times it is given."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.arrivals: list[float] = []
        self.nows: list[float] = []

    def add_request(self, request: Any) -> None:
        self.arrivals.append(request.arrival_time)
        self.inner.add_request(request)

    def schedule(self, now: float) -> Any:
        self.nows.append(now)
        return self.inner.schedule(now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_the_embedder_schedules_on_the_generation_clock() -> None:
    # Generation stamps arrivals and plans steps with `time.perf_counter()` (EngineRequest,
    # LLMEngine.step); the embedder's scheduler must see the same clock, or the arrival
    # order, priority aging and deadlines of its inputs would mean something else.
    fake = _GatedEmbedder()
    fake.gate.set()
    engine = AsyncEmbedder(fake, max_num_waiting=8)  # type: ignore[arg-type]
    recorder = _RecordingScheduler(engine._steps.scheduler)
    engine._steps.scheduler = recorder  # type: ignore[assignment]
    before = time.perf_counter()
    try:
        vectors = asyncio.run(engine.embed([[1], [1, 1]]))
    finally:
        engine.shutdown()
    after = time.perf_counter()
    np.testing.assert_array_equal(vectors, [[1, 1], [2, 1]])
    assert len(recorder.arrivals) == 2 and recorder.nows
    assert before <= recorder.arrivals[0] == recorder.arrivals[1] <= recorder.nows[0] <= after


def test_a_thread_death_fails_every_request_and_is_reported_once() -> None:
    class Fatal(BaseException):
        pass

    fake = _GatedEmbedder()
    run_plan = fake.run_plan

    def dying_run_plan(plan: Any) -> np.ndarray:
        if 777 in plan.input_ids:
            fake.gate.wait(10)
            raise Fatal("injected")
        return run_plan(plan)

    fake.run_plan = dying_run_plan  # type: ignore[method-assign]
    fake.steps.append([])  # the gate is for the dying step only
    engine = AsyncEmbedder(fake, max_num_waiting=8)  # type: ignore[arg-type]
    deaths: list[BaseException] = []

    async def go() -> list[object]:
        engine.watch(deaths.append)
        dying = await _running(engine, [[777]])
        queued = asyncio.ensure_future(engine.embed([[1] * 3]))
        while engine.stats()["num_waiting_seqs"] < 1:
            await asyncio.sleep(0.001)
        fake.gate.set()
        results = await asyncio.gather(dying, queued, return_exceptions=True)
        while not deaths:
            await asyncio.sleep(0.001)
        with pytest.raises(EngineDeadError, match="stopped"):
            await engine.embed([[1]])
        later: list[BaseException] = []
        engine.watch(later.append)  # watching a dead engine reports at once
        await asyncio.sleep(0.01)
        return [*results, later]

    try:
        dying, queued, later = asyncio.run(go())
    finally:
        engine.shutdown()
    for result in (dying, queued):
        assert isinstance(result, EngineDeadError) and "Fatal('injected')" in str(result)
    assert len(deaths) == 1 and isinstance(deaths[0], Fatal)
    assert isinstance(later, list) and len(later) == 1 and later[0] is deaths[0]
    assert not engine.is_running
    assert engine.stats()["num_waiting_seqs"] == 0
