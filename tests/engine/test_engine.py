"""The engine end to end on tiny models: LLM.generate and AsyncEngine against transformers.

The reference is transformers' greedy ``generate`` on each prompt alone; our engine runs the
prompts together (continuous batching, chunked prefill, preemption with a tiny KV cache) and,
through AsyncEngine, as concurrent streams joining at different times. Tokens must be equal,
logprobs within 1e-3 (float32). Both run on ``--device`` (default cpu).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from parity_support import (
    Reference,
    assert_matches_reference,
    assert_stream_adds_up,
    run_async,
    stream_outputs,
)

from ferrollm import LLM, SamplingParams
from ferrollm.engine import AsyncEngine, EngineDeadError, EngineRequest, RequestOutput

NUM_NEW_TOKENS = 8
PROMPTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "What is",
    "def f(x): return x * 2",
    "Paris is the capital of France? hello, world: 0123456789",
]
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True, logprobs=0)
#: A step budget, seat count and KV cache small enough that prompts prefill in chunks, seats
#: run out and sequences are preempted (16 blocks of 4 tokens; 2 KiB a block).
BUSY = {
    "dtype": "float32",  # the parity mode: transformers is the oracle
    "max_num_batched_tokens": 8,
    "block_size": 4,
    "max_num_seqs": 4,
    "kv_cache_memory": 16 * 2048,
}


@pytest.fixture(scope="module", params=["llama3", "qwen2"])
def model_dir(request: pytest.FixtureRequest, tiny_model_factory: Callable[..., Path]) -> Path:
    return tiny_model_factory(request.param)


@pytest.fixture(scope="module")
def reference(model_dir: Path, device: str) -> Reference:
    return Reference.from_dir(model_dir, device, NUM_NEW_TOKENS)


@pytest.fixture(scope="module")
def llm(model_dir: Path, device: str) -> LLM:
    return LLM(model_dir, device=device, **BUSY)


def test_greedy_batch_matches_transformers(llm: LLM, reference: Reference) -> None:
    outputs = llm.generate(PROMPTS, GREEDY)
    assert [o.prompt for o in outputs] == PROMPTS
    for output in outputs:
        assert output.finished
        assert output.prompt_token_ids == reference.tokenizer(output.prompt)["input_ids"]
        assert_matches_reference(reference, output)
    assert llm.engine.scheduler.stats()["num_preemptions"] > 0


def test_token_id_prompts_equal_text_prompts(llm: LLM) -> None:
    by_text = llm.generate(PROMPTS[:2], GREEDY)
    by_ids = llm.generate([o.prompt_token_ids for o in by_text], GREEDY)
    assert [o.outputs[0].token_ids for o in by_ids] == [o.outputs[0].token_ids for o in by_text]
    assert by_ids[0].prompt is None


def test_streams_joining_midway_equal_the_batch(llm: LLM, reference: Reference) -> None:
    async def body(engine: AsyncEngine) -> list[list[RequestOutput]]:
        delays = [0.0, 0.0, 0.05, 0.1, 0.1]
        streams = [
            stream_outputs(engine, p, GREEDY, d) for p, d in zip(PROMPTS, delays, strict=True)
        ]
        return list(await asyncio.gather(*streams))

    for outputs in run_async(llm, body):
        assert_matches_reference(reference, assert_stream_adds_up(outputs))


def _first_ascii_word(text: str) -> str:
    word = next(
        (w for w in text[1:].split() if len(w) >= 2 and w.isascii() and w.isprintable()), None
    )
    assert word is not None, f"no stop-string candidate in {text!r}"
    return word[:2]


@pytest.mark.parametrize("include", [False, True])
def test_stop_strings_cut_the_text_and_name_the_stop(llm: LLM, include: bool) -> None:
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    full = {o.prompt: o.outputs[0].text for o in llm.generate(PROMPTS, params)}
    prompt = next(
        p for p, text in full.items() if any(w.isascii() and len(w) > 1 for w in text[1:].split())
    )
    stop = _first_ascii_word(full[prompt])
    stopped = SamplingParams(
        temperature=0,
        max_tokens=24,
        ignore_eos=True,
        stop=[stop],
        include_stop_str_in_output=include,
    )
    (output,) = llm.generate(prompt, stopped)
    completion = output.outputs[0]
    cut = full[prompt].index(stop) + (len(stop) if include else 0)
    assert completion.text == full[prompt][:cut]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop)


def test_stop_token_ids_end_the_sequence(llm: LLM) -> None:
    (free,) = llm.generate(PROMPTS[1], GREEDY)
    token = free.outputs[0].token_ids[3]
    params = SamplingParams(
        temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True, stop_token_ids=[token]
    )
    (output,) = llm.generate(PROMPTS[1], params)
    completion = output.outputs[0]
    cut = free.outputs[0].token_ids.index(token) + 1
    assert completion.token_ids == free.outputs[0].token_ids[:cut]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", token)


def test_a_seeded_request_samples_the_same_alone_and_in_a_busy_batch(llm: LLM) -> None:
    seeded = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, seed=1234, ignore_eos=True)
    (alone,) = llm.generate(PROMPTS[3], seeded)
    others = [
        SamplingParams(temperature=1.0, max_tokens=12, seed=i, ignore_eos=True) for i in range(4)
    ]
    batch = llm.generate(PROMPTS, [*others[:3], seeded, *others[3:]])
    assert batch[3].outputs[0].token_ids == alone.outputs[0].token_ids
    unseeded = llm.generate(
        [PROMPTS[3]] * 2, SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    )
    assert unseeded[0].outputs[0].token_ids != unseeded[1].outputs[0].token_ids


def test_n_gives_n_sequences(llm: LLM) -> None:
    (sampled,) = llm.generate(
        PROMPTS[0], SamplingParams(n=3, temperature=1.0, max_tokens=6, seed=5)
    )
    assert [c.index for c in sampled.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in sampled.outputs}) > 1
    assert all(len(c.token_ids) == 6 or c.finish_reason == "stop" for c in sampled.outputs)


def test_chat_applies_the_template(llm: LLM) -> None:
    messages = [{"role": "user", "content": "Hello world"}]
    (output,) = llm.chat(messages, SamplingParams(temperature=0, max_tokens=4))
    assert output.prompt == "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n"
    assert output.prompt_token_ids[0] == 1  # <|im_start|>, written by the template, not added
    assert len(llm.chat([messages, messages], SamplingParams(max_tokens=2))) == 2


@pytest.mark.parametrize("how", ["aclose", "break", "cancel"])
def test_closing_the_stream_aborts_and_frees_blocks(
    llm: LLM, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    aborted: list[tuple[str, bool]] = []
    real_abort = llm.engine.abort_request

    def spy(request_id: str) -> bool:
        aborted.append((request_id, real_abort(request_id)))
        return aborted[-1][1]

    monkeypatch.setattr(llm.engine, "abort_request", spy)
    real_run = llm.engine.runner.run

    def slow_run(plan: Any) -> torch.Tensor:
        time.sleep(0.01)  # so the request is surely still running when the abort lands
        return real_run(plan)

    monkeypatch.setattr(llm.engine.runner, "run", slow_run)
    long = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)

    async def body(engine: AsyncEngine) -> list[RequestOutput]:
        seen: list[RequestOutput] = []
        if how == "cancel":
            task = asyncio.create_task(
                _collect(engine.generate(engine.request(PROMPTS[1], long)), seen)
            )
            while len(seen) < 2:
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            stream = engine.generate(engine.request(PROMPTS[1], long))
            async for output in stream:
                seen.append(output)
                if len(seen) == 2:
                    break
            if how == "aclose":
                await stream.aclose()
            del stream  # "break": the loop's async-generator hook closes it once unreferenced
        await _until_idle(engine)
        return seen

    seen = run_async(llm, body)
    assert not seen[-1].finished
    assert aborted == [(seen[-1].request_id, True)]
    stats = llm.engine.scheduler.stats()
    assert (stats["num_unfinished_requests"], stats["num_used_blocks"]) == (0, 0)


async def _collect(stream: Any, into: list[RequestOutput]) -> None:
    async for output in stream:
        into.append(output)


async def _until_idle(engine: AsyncEngine, timeout: float = 30.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if engine.engine.num_unfinished_requests == 0:
            await asyncio.sleep(0.05)  # let the engine thread go back to waiting
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the engine never went idle")


def test_a_failing_request_fails_alone(llm: LLM, reference: Reference, model_dir: Path) -> None:
    vocab = llm.engine.model_config.vocab_size
    too_long = [5] * 200  # BUSY's KV cache lowers max_model_len to 60
    # Admitted, but its only allowed token is also a bad word: its row has no finite logit.
    dead = SamplingParams(temperature=0, max_tokens=4, allowed_token_ids=[7], bad_words=[[7]])

    async def body(engine: AsyncEngine) -> list[Any]:
        async def outcome(prompt: Any, params: SamplingParams) -> Any:
            try:
                return [o async for o in engine.generate(engine.request(prompt, params))][-1]
            except Exception as e:
                return e

        prompts: list[Any] = [PROMPTS[0], [1, vocab], too_long, [], PROMPTS[2], PROMPTS[1]]
        params = [GREEDY] * 4 + [dead, GREEDY]
        return list(await asyncio.gather(*(outcome(*a) for a in zip(prompts, params, strict=True))))

    good0, bad_id, long, empty, dead_row, good1 = run_async(llm, body)
    assert_matches_reference(reference, good0)
    assert_matches_reference(reference, good1)
    assert isinstance(bad_id, ValueError) and f"[0, {vocab})" in str(bad_id)
    assert isinstance(long, ValueError) and "max_model_len" in str(long)
    assert isinstance(empty, ValueError) and "at least 1 token" in str(empty)
    assert isinstance(dead_row, ValueError) and "no finite value" in str(dead_row)
    # The failure keeps the rule it broke (it was a bare ValueError without one).
    assert getattr(dead_row, "code", None) == "no_finite_logit"
    assert llm.engine.scheduler.stats()["num_used_blocks"] == 0


def test_parameters_that_do_not_fit_the_model_are_refused_at_admission(llm: LLM) -> None:
    vocab = llm.engine.model_config.vocab_size
    wrong_length = SamplingParams(embedding_bias=[0.0] * (vocab - 1))
    with pytest.raises(ValueError, match="`embedding_bias`") as info:
        llm.engine.add_request(EngineRequest.of("bias", [1, 2], wrong_length))
    assert getattr(info.value, "param", None) == "embedding_bias"
    with pytest.raises(ValueError, match="`logit_bias`"):
        llm.engine.add_request(
            EngineRequest.of("bias", [1, 2], SamplingParams(logit_bias={vocab: 1.0}))
        )
    assert llm.engine.num_unfinished_requests == 0
    dead = SamplingParams(temperature=0, max_tokens=4, allowed_token_ids=[7], bad_words=[[7]])
    with pytest.raises(ValueError, match="no finite value"):
        llm.generate(PROMPTS[0], dead)
    assert llm.engine.num_unfinished_requests == 0


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(
    llm: LLM, reference: Reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_run = llm.engine.runner.run
    calls = iter(range(1000))

    def flaky_run(plan: Any) -> torch.Tensor:
        if next(calls) == 1:
            raise RuntimeError("device fell over")
        return real_run(plan)

    monkeypatch.setattr(llm.engine.runner, "run", flaky_run)

    async def body(engine: AsyncEngine) -> tuple[BaseException, RequestOutput]:
        with pytest.raises(RuntimeError, match="device fell over") as info:
            await stream_outputs(engine, PROMPTS[0], GREEDY, 0.0)
        return info.value, (await stream_outputs(engine, PROMPTS[1], GREEDY, 0.0))[-1]

    error, later = run_async(llm, body)
    assert "aborted" in str(error)
    assert_matches_reference(reference, later)


def test_offline_errors_leave_the_engine_usable(llm: LLM, reference: Reference) -> None:
    with pytest.raises(ValueError, match="vocabulary"):
        llm.generate([PROMPTS[0], [10**6]], GREEDY)
    assert llm.engine.num_unfinished_requests == 0
    with pytest.raises(ValueError, match="one per prompt"):
        llm.generate(PROMPTS[:2], [GREEDY])
    assert_matches_reference(reference, llm.generate(PROMPTS[0], GREEDY)[0])


def test_more_candidates_than_seats_are_refused_by_name(llm: LLM) -> None:
    # Each best_of candidate takes a seat (BUSY has 4).
    with pytest.raises(ValueError, match=r"`best_of` must be <= max_num_seqs \(4\); got 5"):
        llm.generate("x", SamplingParams(n=2, best_of=5))
    assert llm.engine.num_unfinished_requests == 0


def test_outputs_reach_the_event_loop_once_per_step(llm: LLM) -> None:
    hand_offs: list[int] = []

    async def body(engine: AsyncEngine) -> int:
        dispatch = engine._dispatch

        def counting(deliveries: list[Any]) -> None:
            hand_offs.append(len(deliveries))
            dispatch(deliveries)

        engine._dispatch = counting  # type: ignore[method-assign]
        steps_before = llm.engine.scheduler.stats()["num_steps"]
        await asyncio.gather(*(stream_outputs(engine, p, GREEDY, 0.0) for p in PROMPTS))
        await _until_idle(engine)
        return int(llm.engine.scheduler.stats()["num_steps"]) - steps_before

    num_steps = run_async(llm, body)
    assert len(hand_offs) <= num_steps
    assert max(hand_offs) > 1  # several requests' outputs in one hand-off
    assert sum(hand_offs) >= len(PROMPTS) * NUM_NEW_TOKENS // 4


def test_shutdown_ends_open_streams(llm: LLM) -> None:
    async def body(engine: AsyncEngine) -> None:
        params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
        stream = engine.generate(engine.request(PROMPTS[1], params))
        await stream.__anext__()
        engine.shutdown()
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError):
            await engine.generate(engine.request(PROMPTS[0])).__anext__()

    run_async(llm, body)
    assert llm.engine.num_unfinished_requests == 0
    while llm.engine.has_unfinished_requests():  # the aborts take effect at the next step
        llm.engine.step()
