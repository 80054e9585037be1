"""Running one request for a handler: the engine's outputs, timed, with metrics observed.

`Timing` turns each step's times into MindIE's fields (docs/api/mindie.md#timing-fields):
``prefill_time`` (ms, arrival to first token), one ``decode_time`` per later step (ms, since the
previous token), and per step the engine batch size and the queue wait (µs: arrival to first
scheduling for the first token, then the gap between a token and the start of the step that
computed the next one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from ferrollm.server.http import aclose

if TYPE_CHECKING:
    from ferrollm.engine import RequestOutput
    from ferrollm.engine.request import EngineRequest
    from ferrollm.server.context import ServerContext

T = TypeVar("T")


@dataclass(slots=True)
class Timing:
    """One request's timings, in ``time.perf_counter()`` seconds and the units MindIE reports."""

    arrival: float = field(default_factory=time.perf_counter)
    last_token: float | None = None
    first_scheduled: float | None = None
    prefill_ms: float | None = None
    decode_ms: list[float] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    queue_waits_us: list[int] = field(default_factory=list)

    def observe(self, out: RequestOutput) -> int:
        """Record a step's output; the number of tokens it added (0: no new token, or none
        shown yet). An output with no sequences is a step of a best_of > n request whose
        candidates stay hidden until the end: it still counts as a step here."""
        num_new = sum(len(c.new_token_ids) for c in out.outputs)
        if num_new == 0 and out.outputs:
            return 0
        now = time.perf_counter()
        started, finished, batch = now, now, 1
        if out.step is not None:
            started, finished, batch = out.step.started, out.step.finished, out.step.num_seqs
        if self.first_scheduled is None:
            self.first_scheduled = out.first_scheduled_time or started
        if self.last_token is None:
            wait = self.first_scheduled - self.arrival
            self.prefill_ms = (finished - self.arrival) * 1e3
        else:
            wait = started - self.last_token
            self.decode_ms.append((finished - self.last_token) * 1e3)
        self.queue_waits_us.append(max(0, round(wait * 1e6)))
        self.batch_sizes.append(batch)
        self.last_token = finished
        return num_new


async def generate(
    ctx: ServerContext,
    request: EngineRequest,
    timing: Timing,
    client_id: str | None = None,
    client_id_field: str = "id",
) -> AsyncIterator[RequestOutput]:
    """The request's outputs as the engine produces them; closing the iterator aborts it.

    The request enters the engine only past the admission bound (503 otherwise), and gets the
    server's ``request_timeout`` as its deadline when it names no timeout of its own.
    ``client_id`` is the client's own id for it, from ``client_id_field`` (MindIE's ``id``,
    the ``X-Ferrollm-Client-Id`` header: 409 while one runs)."""
    request = with_server_deadline(ctx, request)
    with ctx.admission.waiting(request.num_prompt_tokens) as ticket:
        if client_id is None:
            stream = ctx.generator.generate(request)
        else:
            stream = ctx.generator.generate(request, client_id, client_id_field)
        try:
            async for out in stream:
                ticket.started()
                yield _observed(ctx, request, timing, out)
        finally:
            await aclose(stream)


def with_server_deadline(ctx: ServerContext, request: EngineRequest) -> EngineRequest:
    """``request`` with the server's default deadline, unless it has a timeout of its own."""
    timeout = ctx.config.request_timeout
    if timeout is None or request.params.timeout_s is not None or request.deadline is not None:
        return request
    return dataclasses.replace(request, deadline=request.arrival_time + timeout)


def _observed(
    ctx: ServerContext, request: EngineRequest, timing: Timing, out: RequestOutput
) -> RequestOutput:
    metrics = ctx.metrics
    if num_new := timing.observe(out):
        metrics.generation_tokens.inc(num_new)
        if timing.decode_ms:
            metrics.inter_token_latency.observe(timing.decode_ms[-1] / 1e3)
        elif timing.prefill_ms is not None:
            metrics.time_to_first_token.observe(timing.prefill_ms / 1e3)
    if out.finished:
        _observe_finished(ctx, out, timing, request.num_prompt_tokens)
    return out


def _observe_finished(ctx: ServerContext, out: RequestOutput, timing: Timing, num: int) -> None:
    metrics = ctx.metrics
    metrics.prompt_tokens.inc(num)
    if timing.last_token is not None:
        metrics.e2e_request_latency.observe(timing.last_token - timing.arrival)
    if timing.first_scheduled is not None:
        metrics.request_queue_time.observe(max(0.0, timing.first_scheduled - timing.arrival))
    metrics.request_finished(out.outputs[0].finish_reason or "stop")


async def prime(stream: AsyncIterator[T]) -> AsyncIterator[T]:
    """``stream`` with its first item already awaited, so that a request the engine rejects
    raises here (an HTTP error status) rather than after a streaming response has begun."""
    try:
        first = await anext(stream)
    except BaseException:
        await aclose(stream)
        raise
    return _chain(first, stream)


async def _chain(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    try:
        yield first
        async for item in rest:
            yield item
    finally:
        await aclose(rest)


async def merge(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Items of several streams as they come, tagged with the stream's index; closing the
    merged iterator closes (aborts) them all. An error in one stream ends the merge."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, T] | BaseException | None] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put((index, item))
            await queue.put(None)
        except Exception as e:
            await queue.put(e)
        finally:
            await aclose(stream)

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            got = await queue.get()
            if got is None:
                remaining -= 1
            elif isinstance(got, BaseException):
                raise got
            else:
                yield got
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
