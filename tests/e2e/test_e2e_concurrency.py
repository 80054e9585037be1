"""32 streaming clients at once (AsyncOpenAI): all finish, each with its own greedy text.

Half are completions and half chats, all distinct; each client's concatenated deltas must equal
the offline engine's greedy text for its prompt, with 24 completion tokens (ignore_eos), even
though the server runs them batched together.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import openai

from ferrollm import LLM, SamplingParams
from ferrollm.tokenizer import Tokenizer

from .e2e_support import MODEL, Server

NUM_CLIENTS = 32
MAX_TOKENS = 24
TOPICS = [
    "the sea", "a mountain", "a library", "the moon", "a garden", "a train", "winter",
    "a violin", "the desert", "a lighthouse", "bread", "a river", "a clock", "the forest",
    "a bridge", "rain",
]  # fmt: skip


@dataclass
class Result:
    text: str
    finish_reasons: list[str | None]
    usage: Any
    batch_sizes: list[int]


def requests() -> list[dict[str, Any]]:
    """32 distinct requests: a completion and a chat per topic."""
    out: list[dict[str, Any]] = []
    for topic in TOPICS:
        out.append({"prompt": f"A short poem about {topic}:\n"})
        out.append({"messages": [{"role": "user", "content": f"Describe {topic} in a sentence."}]})
    assert len(out) == NUM_CLIENTS
    return out


async def run_one(client: openai.AsyncOpenAI, request: dict[str, Any]) -> Result:
    common: dict[str, Any] = {
        "model": MODEL,
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "extra_body": {"ignore_eos": True},
    }
    text, reasons, usage, batch_sizes = "", [], None, []
    if "prompt" in request:
        stream = await client.completions.create(prompt=request["prompt"], **common)
        async for chunk in stream:
            for choice in chunk.choices:
                text += choice.text
                reasons.append(choice.finish_reason)
            if chunk.usage is not None:
                usage = chunk.usage
                batch_sizes = (chunk.usage.model_extra or {}).get("batch_size", [])
    else:
        chat = await client.chat.completions.create(messages=request["messages"], **common)
        async for chunk in chat:
            for c in chunk.choices:
                text += c.delta.content or ""
                reasons.append(c.finish_reason)
            if chunk.usage is not None:
                usage = chunk.usage
    return Result(text, reasons, usage, batch_sizes)


async def run_all(server: Server) -> list[Result]:
    async with openai.AsyncOpenAI(
        base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120
    ) as client:
        return await asyncio.gather(*(run_one(client, r) for r in requests()))


def test_32_concurrent_streams_each_get_their_greedy_text(
    server: Server, llm: LLM, tokenizer: Tokenizer
) -> None:
    prompts = [
        tokenizer.encode(r["prompt"]) if "prompt" in r else tokenizer.encode_chat(r["messages"])
        for r in requests()
    ]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    expected = [out.outputs[0].text for out in llm.generate(prompts, params)]
    assert len(set(expected)) == NUM_CLIENTS  # distinct answers: a mix-up would show

    results = asyncio.run(run_all(server))

    for i, (result, text, prompt) in enumerate(zip(results, expected, prompts, strict=True)):
        assert result.text == text, f"client {i}"
        assert result.finish_reasons[-1] == "length"
        assert all(r is None for r in result.finish_reasons[:-1])
        assert result.usage is not None, f"client {i} got no usage"
        assert result.usage.completion_tokens == MAX_TOKENS
        assert result.usage.prompt_tokens == len(prompt)
    # The server really batched them: some step ran several of these sequences at once.
    assert max(size for r in results for size in r.batch_sizes) > 1
    assert server.metric("ferrollm_num_requests_running") == 0
    assert server.metric("ferrollm_kv_blocks_used") == 0
