"""``ferrollm serve --device cuda`` on the default model, through the openai SDK.

Marked ``cuda`` (skipped where torch sees no GPU). One server with the test servers' flags
(float32, dense weights: greedy results do not depend on how requests are batched) on the GPU:
a greedy completion and a greedy chat stream exactly the text they return whole, and 32
concurrent streams (AsyncOpenAI; completions and chats, ignore_eos) all finish with exactly
``max_tokens`` tokens, each with the text its request returns whole. The offline engine's
parity with transformers on the GPU is tests/engine/test_cuda_parity.py's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from .e2e_support import MODEL, STORY, Server, launch_server
from .test_e2e_concurrency import MAX_TOKENS, NUM_CLIENTS, requests, run_all

pytestmark = pytest.mark.cuda

#: Where the server runs.
DEVICE = "cuda"
PROMPT = "Once upon a time, in a small village by the sea,"
NUM_TOKENS = 32
GREEDY: dict[str, Any] = {
    "model": MODEL,
    "temperature": 0,
    "max_tokens": NUM_TOKENS,
    "extra_body": {"ignore_eos": True},
}


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The default model served on the GPU; at the end its log must hold no traceback."""
    server = launch_server(tmp_path_factory.mktemp("gpu-server"), "--device", DEVICE)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
    log = server.log()
    assert "Traceback" not in log, f"the server logged an exception:\n{log}"


@pytest.fixture(scope="module")
def gpu_client(gpu_server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gpu_server.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_the_server_runs_on_the_gpu(gpu_server: Server) -> None:
    assert f" on {DEVICE} in float32" in gpu_server.log(), gpu_server.log()


def test_a_streamed_completion_equals_the_whole_one(gpu_client: openai.OpenAI) -> None:
    whole = gpu_client.completions.create(prompt=PROMPT, **GREEDY)
    (choice,) = whole.choices
    assert choice.finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == NUM_TOKENS
    chunks = list(gpu_client.completions.create(prompt=PROMPT, stream=True, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "length" and all(r is None for r in reasons[:-1])
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == NUM_TOKENS


def test_a_streamed_chat_equals_the_whole_one(gpu_client: openai.OpenAI) -> None:
    whole = gpu_client.chat.completions.create(messages=STORY, **GREEDY)
    (choice,) = whole.choices
    assert choice.finish_reason == "length" and choice.message.content
    assert whole.usage is not None and whole.usage.completion_tokens == NUM_TOKENS
    stream = gpu_client.chat.completions.create(messages=STORY, stream=True, **GREEDY)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        choice.message.content
    )
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "length" and all(r is None for r in reasons[:-1])
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == NUM_TOKENS


async def _whole_texts(server: Server) -> list[str]:
    """The non-streamed greedy text of each of the concurrency test's `requests`, all at once."""
    common: dict[str, Any] = {
        "model": MODEL,
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "extra_body": {"ignore_eos": True},
    }
    async with openai.AsyncOpenAI(
        base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120
    ) as client:

        async def one(request: dict[str, Any]) -> str:
            if "prompt" in request:
                completion = await client.completions.create(prompt=request["prompt"], **common)
                assert completion.usage is not None
                assert completion.usage.completion_tokens == MAX_TOKENS
                return completion.choices[0].text
            chat = await client.chat.completions.create(messages=request["messages"], **common)
            assert chat.usage is not None and chat.usage.completion_tokens == MAX_TOKENS
            return chat.choices[0].message.content or ""

        return list(await asyncio.gather(*(one(r) for r in requests())))


def test_32_concurrent_streams_finish_with_their_whole_text(gpu_server: Server) -> None:
    results = asyncio.run(run_all(gpu_server))
    assert len(results) == NUM_CLIENTS
    for i, result in enumerate(results):
        assert result.finish_reasons[-1] == "length", f"client {i}"
        assert all(r is None for r in result.finish_reasons[:-1]), f"client {i}"
        assert result.usage is not None, f"client {i} got no usage"
        assert result.usage.completion_tokens == MAX_TOKENS, f"client {i}"
    # The server really batched them: some step ran several of these sequences at once.
    assert max(size for r in results for size in r.batch_sizes) > 1
    whole = asyncio.run(_whole_texts(gpu_server))
    assert len(set(whole)) == NUM_CLIENTS  # distinct answers: a mix-up would show
    for i, (result, text) in enumerate(zip(results, whole, strict=True)):
        assert result.text == text, f"client {i}: streamed {result.text!r}, whole {text!r}"
    assert gpu_server.metric("ferrollm_num_requests_running") == 0
    assert gpu_server.metric("ferrollm_kv_blocks_used") == 0
