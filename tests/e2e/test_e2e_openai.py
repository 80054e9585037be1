"""The ``/v1`` routes through the official OpenAI SDK against a real server.

The oracle is the offline engine: greedy text and token counts must equal ``LLM.generate`` /
``LLM.chat`` on the same prompt, and prompt token counts must equal the offline tokenizer's.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from .e2e_support import (
    MODEL,
    PROMPT,
    PROMPT_TOKENS,
    QUESTION,
    QUESTION_TOKENS,
    STORY,
    STORY_TOKENS,
    Oracle,
    spanning_stop,
)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_chat_greedy_equals_the_offline_engine(client: openai.OpenAI, oracle: Oracle) -> None:
    expected = oracle.chat(QUESTION, QUESTION_TOKENS)
    response = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=QUESTION_TOKENS
    )
    (choice,) = response.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.text
    assert "Paris" in expected.text
    assert choice.finish_reason == "stop" == expected.finish_reason  # EOS before 32 tokens
    assert response.model == MODEL
    assert response.object == "chat.completion"
    assert response.usage is not None
    assert response.usage.prompt_tokens == len(oracle.tokenizer.encode_chat(QUESTION))
    assert response.usage.completion_tokens == len(expected.token_ids)  # EOS counts
    assert response.usage.total_tokens == (
        response.usage.prompt_tokens + response.usage.completion_tokens
    )
    # MindIE's extensions on /v1: prefill time and one decode time per later token.
    extra = response.model_extra or {}
    assert isinstance(extra["prefill_time"], float) and extra["prefill_time"] > 0
    assert len(extra["decode_time_arr"]) == len(expected.token_ids) - 1


def test_chat_stream_deltas_concatenate_to_the_greedy_text(
    client: openai.OpenAI, oracle: Oracle
) -> None:
    expected = oracle.chat(STORY, STORY_TOKENS)
    stream = client.chat.completions.create(
        model=MODEL, messages=STORY, temperature=0, max_tokens=STORY_TOKENS, stream=True
    )
    chunks = list(stream)
    assert chunks, "no chunks"
    # role in every chunk (MindIE's samples; Databricks needs it in the first one at least).
    assert all(c.choices[0].delta.role == "assistant" for c in chunks if c.choices)
    assert all("prefill_time" not in (c.model_extra or {}) for c in chunks)  # not streamed
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    assert all(c.object == "chat.completion.chunk" and c.model == MODEL for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "length" and all(r is None for r in reasons[:-1])
    final = chunks[-1]
    assert final.usage is not None, "the final chunk carries usage"
    assert final.usage.prompt_tokens == len(oracle.tokenizer.encode_chat(STORY))
    assert final.usage.completion_tokens == STORY_TOKENS == len(expected.token_ids)
    assert all(c.usage is None for c in chunks[:-1])
    assert "full_text" not in (final.model_extra or {})  # fullTextEnabled is off


def test_completion_greedy_equals_the_offline_engine(client: openai.OpenAI, oracle: Oracle) -> None:
    expected = oracle.complete(PROMPT, PROMPT_TOKENS)
    response = client.completions.create(
        model=MODEL, prompt=PROMPT, temperature=0, max_tokens=PROMPT_TOKENS
    )
    (choice,) = response.choices
    assert choice.text == expected.text
    assert choice.finish_reason == expected.finish_reason == "length"
    assert response.object == "text_completion"
    assert response.usage is not None
    assert response.usage.prompt_tokens == len(oracle.tokenizer.encode(PROMPT))
    assert response.usage.completion_tokens == len(expected.token_ids) == PROMPT_TOKENS
    extra = response.usage.model_extra or {}  # MindIE's per-step usage arrays
    assert len(extra["batch_size"]) == len(extra["queue_wait_time"]) == PROMPT_TOKENS

    stream = client.completions.create(
        model=MODEL, prompt=PROMPT, temperature=0, max_tokens=PROMPT_TOKENS, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == response.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == PROMPT_TOKENS


def test_max_tokens_ends_with_length(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL, messages=STORY, temperature=0, max_tokens=3
    )
    assert response.choices[0].finish_reason == "length"
    assert response.usage is not None and response.usage.completion_tokens == 3
    response = client.completions.create(
        model=MODEL,
        prompt="Hi",
        temperature=0,
        max_tokens=5,
        extra_body={"ignore_eos": True},
    )
    assert response.choices[0].finish_reason == "length"
    assert response.usage is not None and response.usage.completion_tokens == 5


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_completion_stop_string_across_a_token_boundary(
    client: openai.OpenAI, oracle: Oracle, stream: bool
) -> None:
    greedy = oracle.complete(PROMPT, PROMPT_TOKENS)
    stop = spanning_stop(oracle.tokenizer, greedy.token_ids)
    kwargs: dict[str, Any] = {
        "temperature": 0,
        "max_tokens": PROMPT_TOKENS,
        "stop": ["never seen", stop.stop],
    }
    if stream:
        chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, stream=True, **kwargs))
        choices = [c.choices[0] for c in chunks if c.choices]
        text = "".join(c.text for c in choices)
        final, usage = choices[-1], chunks[-1].usage
    else:
        response = client.completions.create(model=MODEL, prompt=PROMPT, **kwargs)
        final, usage = response.choices[0], response.usage
        text = final.text
    assert text == stop.text_before  # nothing of the stop string leaked, even half of it
    assert final.finish_reason == "stop"
    assert (final.model_extra or {})["stop_reason"] == stop.stop
    assert usage is not None and usage.completion_tokens == stop.num_tokens


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_chat_stop_string_across_a_token_boundary(
    client: openai.OpenAI, oracle: Oracle, stream: bool
) -> None:
    greedy = oracle.chat(STORY, STORY_TOKENS)
    stop = spanning_stop(oracle.tokenizer, greedy.token_ids)
    kwargs: dict[str, Any] = {"temperature": 0, "max_tokens": STORY_TOKENS, "stop": stop.stop}
    if stream:
        chunks = list(
            client.chat.completions.create(model=MODEL, messages=STORY, stream=True, **kwargs)
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish_reason = chunks[-1].choices[0].finish_reason
        usage = chunks[-1].usage
    else:
        response = client.chat.completions.create(model=MODEL, messages=STORY, **kwargs)
        text = response.choices[0].message.content or ""
        finish_reason, usage = response.choices[0].finish_reason, response.usage
    assert text == stop.text_before
    assert finish_reason == "stop"
    assert usage is not None and usage.completion_tokens == stop.num_tokens


def test_seed_makes_sampling_reproducible(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": STORY,
        "temperature": 0.8,
        "seed": 1234,
        "max_tokens": 16,
    }
    first = client.chat.completions.create(**kwargs).choices[0].message.content
    second = client.chat.completions.create(**kwargs).choices[0].message.content
    assert first and first == second
    streamed = client.chat.completions.create(stream=True, **kwargs)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == first


def test_n_and_logprobs(client: openai.OpenAI, oracle: Oracle) -> None:
    response = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        n=2,
        temperature=0.8,
        seed=7,
        max_tokens=6,
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in response.choices] == [0, 1]
    for choice in response.choices:
        assert choice.logprobs is not None and choice.logprobs.tokens is not None
        assert len(choice.logprobs.tokens) == 6
        assert "".join(choice.logprobs.tokens) == choice.text
    assert response.usage is not None and response.usage.completion_tokens == 12

    expected = oracle.chat(QUESTION, QUESTION_TOKENS)
    chat = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        temperature=0,
        max_tokens=QUESTION_TOKENS,
        logprobs=True,
        top_logprobs=2,
    )
    logprobs = chat.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert len(logprobs.content) == len(expected.token_ids)
    for entry in logprobs.content:
        assert len(entry.top_logprobs) == 2
        # Greedy: the chosen token is the most likely one.
        assert entry.logprob == pytest.approx(max(t.logprob for t in entry.top_logprobs))


def test_bad_requests_name_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=QUESTION, top_p=1.5, max_tokens=4)
    error = info.value.body
    assert isinstance(error, dict)
    assert error["param"] == "top_p" and error["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as not_found:
        client.completions.create(model="no-such-model", prompt="Hi", max_tokens=1)
    assert isinstance(not_found.value.body, dict) and not_found.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as conflict:
        client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            max_tokens=4,
            tools=[{"type": "function", "function": {"name": "f", "description": "F."}}],
            tool_choice={"type": "function", "function": {"name": "g"}},
        )
    body = conflict.value.body
    assert isinstance(body, dict)
    assert body["param"] == "tool_choice.function.name", body
    # The server still serves.
    response = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0)
    assert response.usage is not None and response.usage.completion_tokens >= 1
