"""A waiting request's place in the queue: the scheduler's admission order through the engine
(`LLMEngine.waiting_order`) and, for a request in flight under a client id, through the engine
thread (`AsyncEngine.queue_position`, what ``GET /v1/playground/queue/{client_id}`` reads)."""

from __future__ import annotations

import asyncio
from typing import Any

from parity_support import run_async

from ferrollm import LLM, SamplingParams
from ferrollm.engine import AsyncEngine, EngineRequest, RequestOutput

LONG = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)


def test_the_waiting_order_is_priority_then_arrival(tiny_model_factory: Any) -> None:
    llm = LLM(tiny_model_factory("llama3"), device="cpu", dtype="float32", max_num_seqs=1)
    engine = llm.engine
    for name in ("first", "second", "third"):
        engine.add_request(EngineRequest.of(name, [5, 6, 7], LONG))
    engine.step()  # one seat: "first" runs
    assert engine.waiting_order() == ["second", "third"]
    engine.add_request(EngineRequest.of("urgent", [5, 6], LONG, priority=1))
    assert engine.waiting_order() == ["urgent", "second", "third"]
    engine.abort_request("second")
    engine.step()  # "urgent" takes the seat; "second"'s abort lands
    assert engine.waiting_order() == ["first", "third"]  # the preempted one first


def test_a_client_id_reads_its_place_while_it_waits(tiny_model_factory: Any) -> None:
    llm = LLM(tiny_model_factory("llama3"), device="cpu", dtype="float32", max_num_seqs=1)

    async def body(engine: AsyncEngine) -> tuple[list[int | None], int | None]:
        async def run(i: int) -> list[RequestOutput]:
            request = EngineRequest.of(f"r{i}", [5, 6, 7], LONG)
            return [out async for out in engine.generate(request, f"client-{i}")]

        tasks = [asyncio.create_task(run(i)) for i in range(3)]
        seen: list[int | None] = []
        for _ in range(2000):  # until the engine has published the queue with both waiting
            places = [engine.queue_position(f"client-{i}") for i in (1, 2)]
            if None not in places:
                seen = places
                break
            await asyncio.sleep(0.002)
        unknown = engine.queue_position("nobody")
        await asyncio.gather(*tasks)
        return seen, unknown

    seen, unknown = run_async(llm, body)
    assert seen == [1, 2]
    assert unknown is None
