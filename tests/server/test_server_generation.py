"""What the routes generate, over HTTP: stop strings across token boundaries, stop token ids,
``include_stop_str_in_output``, length, usage counts, ``n`` > 1, logprobs in both OpenAI shapes,
and seeded reproducibility (docs/api/common.md#stop-conditions, docs/api/openai.md#chat-logprobs,
docs/api/openai.md#completions).

Where exact text matters, generation is greedy and restricted (``allowed_token_ids``) to the
tokens whose text is plain ASCII letters, digits and spaces: each such token has its own text,
so token texts join to the output text and identify their ids.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from server_harness import MODEL, ROUTE_PATHS, Server, sse_json

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
NUM_TOKENS = 16


@cache
def plain_tokens(server: Server) -> dict[str, int]:
    """Text -> id of every token whose text is non-empty ASCII letters, digits and spaces."""
    tokenizer = server.tokenizer
    out = {}
    for token_id in range(tokenizer.vocab_size):
        text = tokenizer.decode([token_id])
        if text and all(c.isascii() and (c.isalnum() or c == " ") for c in text):
            out[text] = token_id
    return out


def cmpl(server: Server, **fields: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": NUM_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "allowed_token_ids": sorted(plain_tokens(server).values()),
        **fields,
    }


def chat(server: Server, **fields: Any) -> dict[str, Any]:
    body = cmpl(server, **fields)
    del body["prompt"]
    return {**body, "messages": MESSAGES}


def greedy_tokens(server: Server) -> tuple[str, list[str]]:
    """The greedy completion of PROMPT and its token texts."""
    body = server.post(ROUTE_PATHS["completions"], cmpl(server, logprobs=0)).json()
    [choice] = body["choices"]
    tokens = choice["logprobs"]["tokens"]
    assert "".join(tokens) == choice["text"]
    assert len(tokens) == NUM_TOKENS
    return choice["text"], tokens


def spanning_stop(text: str, tokens: list[str]) -> tuple[str, int, int]:
    """A stop string across a token boundary, at its first occurrence in ``text``: (stop, its
    position, index of the token that completes it)."""
    offset = 0
    for i in range(len(tokens) - 1):
        offset += len(tokens[i])
        stop = text[offset - 1 : offset + 1]  # last char of token i, first of token i + 1
        if text.find(stop) == offset - 1:
            return stop, offset - 1, i + 1
    raise AssertionError(f"no spanning stop string in {tokens}")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_across_tokens(server: Server, stream: bool) -> None:
    text, tokens = greedy_tokens(server)
    stop, position, completing = spanning_stop(text, tokens)
    body = cmpl(server, stop=[stop], stream=stream)
    response = server.post(ROUTE_PATHS["completions"], body)
    if stream:
        chunks = sse_json(response, done=True)
        got = "".join(c["choices"][0]["text"] for c in chunks)
        final, usage = chunks[-1]["choices"][0], chunks[-1]["usage"]
    else:
        got = response.json()["choices"][0]["text"]
        final, usage = response.json()["choices"][0], response.json()["usage"]
    assert got == text[:position], (stop, text)
    assert (final["finish_reason"], final["stop_reason"]) == ("stop", stop)
    # Every token generated counts, the one that completed the stop string included.
    assert usage["completion_tokens"] == completing + 1


def test_stop_string_included(server: Server) -> None:
    text, tokens = greedy_tokens(server)
    stop, position, _ = spanning_stop(text, tokens)
    body = cmpl(server, stop=stop, include_stop_str_in_output=True)
    [choice] = server.post(ROUTE_PATHS["completions"], body).json()["choices"]
    assert choice["text"] == text[: position + len(stop)]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", stop)


def test_chat_stop_string(server: Server) -> None:
    whole = server.post(ROUTE_PATHS["chat"], chat(server, logprobs=True)).json()
    [choice] = whole["choices"]
    text = choice["message"]["content"]
    tokens = [entry["token"] for entry in choice["logprobs"]["content"]]
    assert "".join(tokens) == text
    stop, position, _ = spanning_stop(text, tokens)
    for stream in (False, True):
        response = server.post(ROUTE_PATHS["chat"], chat(server, stop=[stop], stream=stream))
        if stream:
            chunks = sse_json(response, done=True)
            got = "".join(c["choices"][0]["delta"]["content"] for c in chunks)
            reason = chunks[-1]["choices"][0]["finish_reason"]
        else:
            got = response.json()["choices"][0]["message"]["content"]
            reason = response.json()["choices"][0]["finish_reason"]
        assert got == text[:position], (stream, stop, text)
        assert reason == "stop"


def test_databricks_stop_string(server: Server) -> None:
    body: dict[str, Any] = {"prompt": PROMPT, "max_tokens": NUM_TOKENS, "temperature": 0}
    path = ROUTE_PATHS["databricks"]
    text = server.post(path, body).json()["choices"][0]["text"]
    stop = next(text[i : i + 2] for i in range(1, len(text)) if text.find(text[i : i + 2]) == i)
    [choice] = server.post(path, {**body, "stop": [stop]}).json()["choices"]
    assert choice["text"] == text[: text.find(stop)]
    assert choice["finish_reason"] == "stop"


@pytest.mark.parametrize("include", [False, True])
def test_stop_token_ids(server: Server, include: bool) -> None:
    _text, tokens = greedy_tokens(server)
    index = 3
    token_id = plain_tokens(server)[tokens[index]]
    first = tokens.index(tokens[index])
    body = cmpl(server, stop_token_ids=[token_id], include_stop_str_in_output=include)
    response = server.post(ROUTE_PATHS["completions"], body).json()
    [choice] = response["choices"]
    assert choice["text"] == "".join(tokens[: first + 1 if include else first])
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", token_id)
    assert response["usage"]["completion_tokens"] == first + 1


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_length_and_usage(server: Server, route: str) -> None:
    body = (cmpl if route == "completions" else chat)(server, max_tokens=5)
    response = server.post(ROUTE_PATHS[route], body).json()
    [choice] = response["choices"]
    assert choice["finish_reason"] == "length"
    if route == "completions":
        prompt_tokens = len(server.tokenizer.encode(PROMPT))
    else:
        prompt_tokens = len(server.tokenizer.encode_chat(MESSAGES))
    usage = response["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (prompt_tokens, 5)
    assert usage["total_tokens"] == prompt_tokens + 5


def test_generate_usage(server: Server) -> None:
    body = {"text_input": PROMPT, "parameters": {"max_new_tokens": 5, "do_sample": False}}
    details = server.post(ROUTE_PATHS["generate"], body).json()["details"]
    assert (details["generated_tokens"], details["finish_reason"]) == (5, "length")


def sampled(server: Server, route: str, **fields: Any) -> dict[str, Any]:
    body = (cmpl if route == "completions" else chat)(
        server, n=2, seed=1234, temperature=1.0, max_tokens=6, **fields
    )
    del body["allowed_token_ids"]
    return body


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_n_choices_seeded(server: Server, route: str) -> None:
    body = sampled(server, route)
    first = server.post(ROUTE_PATHS[route], body).json()
    assert [c["index"] for c in first["choices"]] == [0, 1]
    usage = first["usage"]
    assert usage["completion_tokens"] == 2 * 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + 12
    if route == "completions":
        assert usage["prompt_tokens"] == len(server.tokenizer.encode(PROMPT))
        # per step of the longest sequence (docs/decisions.md#per-step-usage-arrays)
        assert len(usage["batch_size"]) == 6
        # The prompt's prefill is one sequence; both samples decode together after it.
        assert usage["batch_size"] == [1, 2, 2, 2, 2, 2]
    second = server.post(ROUTE_PATHS[route], body).json()
    assert second["choices"] == first["choices"]  # the seed makes it reproducible


def test_n_choices_streamed(server: Server) -> None:
    """Each choice streams under its own index and finishes with its own chunk; usage comes
    once, on the last chunk; per-index deltas add up to the non-streamed choices."""
    body = sampled(server, "chat")
    whole = server.post(ROUTE_PATHS["chat"], body).json()
    chunks = sse_json(server.post(ROUTE_PATHS["chat"], {**body, "stream": True}), done=True)
    texts = {0: "", 1: ""}
    finishes = []
    for chunk in chunks:
        [choice] = chunk["choices"]
        texts[choice["index"]] += choice["delta"]["content"]
        if choice["finish_reason"] is not None:
            finishes.append(choice["index"])
    assert sorted(finishes) == [0, 1]
    assert chunks[-1]["choices"][0]["finish_reason"] is not None
    assert [("usage" in c) for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1]["usage"] == whole["usage"]
    assert [texts[0], texts[1]] == [c["message"]["content"] for c in whole["choices"]]


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("generate", {"text_input": PROMPT,
                      "parameters": {"do_sample": True, "seed": 99, "max_new_tokens": 8}}),
        ("completions", {"model": MODEL, "prompt": PROMPT, "seed": 99, "max_tokens": 8,
                         "temperature": 1.5}),
        ("chat", {"model": MODEL, "messages": MESSAGES, "seed": 99, "max_tokens": 8,
                  "temperature": 1.5}),
    ],
)  # fmt: skip
def test_seed_reproducible(server: Server, route: str, body: dict[str, Any]) -> None:
    first = server.post(ROUTE_PATHS[route], body).json()
    second = server.post(ROUTE_PATHS[route], body).json()
    pick = {
        "generate": lambda r: r["text_output"],
        "completions": lambda r: r["choices"][0]["text"],
        "chat": lambda r: r["choices"][0]["message"]["content"],
    }[route]
    assert pick(first) == pick(second)


@pytest.mark.parametrize("k", [0, 2, 5])
def test_completions_logprobs(server: Server, k: int) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
            "ignore_eos": True, "logprobs": k}  # fmt: skip
    [choice] = server.post(ROUTE_PATHS["completions"], body).json()["choices"]
    lp = choice["logprobs"]
    assert set(lp) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
    [expected] = server.engine_run("completions", body, server.tokenizer.encode(PROMPT)).outputs
    detok = server.tokenizer.detokenizer
    assert len(expected.logprobs) == 8
    assert lp["tokens"] == [detok.token_text(e.token_id) for e in expected.logprobs]
    assert lp["token_logprobs"] == pytest.approx([e.logprob for e in expected.logprobs])
    offsets = [0]
    for token in lp["tokens"][:-1]:
        offsets.append(offsets[-1] + len(token))
    assert lp["text_offset"] == offsets
    for entry, top in zip(expected.logprobs, lp["top_logprobs"], strict=True):
        assert len(entry.top) == k
        texts = {detok.token_text(t) for t, _ in entry.top}
        chosen = detok.token_text(entry.token_id)
        assert set(top) == texts | {chosen}
        if len(texts) == k:  # k alternatives with k texts: k entries, or k + 1 with the chosen
            assert len(top) == (k if chosen in texts else k + 1)
        # The chosen token's own entry is its logprob.
        assert top[chosen] == pytest.approx(entry.logprob)
        assert all(v <= 0 for v in top.values())


def test_completions_logprobs_offsets_per_choice(server: Server) -> None:
    """With n = 2, each choice's ``text_offset`` starts at 0
    (docs/decisions.md#text-offsets-across-choices); streamed, the offsets keep counting across a
    choice's chunks."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 1.0, "seed": 5,
            "n": 2, "logprobs": 1, "ignore_eos": True}  # fmt: skip
    whole = server.post(ROUTE_PATHS["completions"], body).json()
    for choice in whole["choices"]:
        lp = choice["logprobs"]
        assert lp["text_offset"][0] == 0
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 6
        assert lp["text_offset"] == [sum(map(len, lp["tokens"][:i])) for i in range(6)]
    chunks = sse_json(server.post(ROUTE_PATHS["completions"], {**body, "stream": True}), done=True)
    joined: dict[int, dict[str, list[Any]]] = {0: {}, 1: {}}
    for chunk in chunks:
        [choice] = chunk["choices"]
        for key, values in choice["logprobs"].items():
            joined[choice["index"]].setdefault(key, []).extend(values)
    for choice in whole["choices"]:
        assert joined[choice["index"]] == choice["logprobs"]


@pytest.mark.parametrize("top", [0, 3])
def test_chat_logprobs(server: Server, top: int) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "logprobs": True, "top_logprobs": top}  # fmt: skip
    whole = server.post(ROUTE_PATHS["chat"], body).json()
    [choice] = whole["choices"]
    content = choice["logprobs"]["content"]
    assert len(content) == whole["usage"]["completion_tokens"] == 6
    prompt_ids = server.tokenizer.encode_chat(MESSAGES)
    [expected] = server.engine_run("chat", body, prompt_ids).outputs
    detok = server.tokenizer.detokenizer
    for entry, got in zip(expected.logprobs, content, strict=True):
        assert set(got) == {"token", "logprob", "bytes", "top_logprobs"}
        assert got["token"] == detok.token_text(entry.token_id)
        assert got["bytes"] == list(detok.token_bytes(entry.token_id))
        assert got["logprob"] == pytest.approx(entry.logprob)
        assert len(got["top_logprobs"]) == top
        for alt, (token_id, logprob) in zip(got["top_logprobs"], entry.top, strict=True):
            assert alt == {
                "token": detok.token_text(token_id),
                "logprob": pytest.approx(logprob),
                "bytes": list(detok.token_bytes(token_id)),
            }
    chunks = sse_json(server.post(ROUTE_PATHS["chat"], {**body, "stream": True}), done=True)
    streamed = [e for c in chunks for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == content


@pytest.mark.parametrize("route", ["completions", "chat"])
@pytest.mark.parametrize("stream", [False, True])
def test_eos_counts_and_is_not_text(server: Server, route: str, stream: bool) -> None:
    """EOS (forced with ``logit_bias``) ends with "stop", no text, and counts as a generated
    token (docs/api/common.md#text-and-special-tokens)."""
    eos = server.engine.engine.model_config.eos_token_ids[0]
    body = (cmpl if route == "completions" else chat)(
        server, logit_bias={str(eos): 100}, ignore_eos=False, stream=stream
    )
    del body["allowed_token_ids"]
    response = server.post(ROUTE_PATHS[route], body)
    if stream:
        [chunk] = sse_json(response, done=True)
    else:
        chunk = response.json()
    [choice] = chunk["choices"]
    text = (
        choice["text"]
        if route == "completions"
        else (choice["delta"]["content"] if stream else choice["message"]["content"])
    )
    assert (text, choice["finish_reason"]) == ("", "stop")
    if route == "completions":
        assert choice["stop_reason"] is None
    assert chunk["usage"]["completion_tokens"] == 1


def test_prompt_batch(server: Server) -> None:
    """A list of prompts (docs/decisions.md#prompt-lists): one choice per prompt in order, usage
    summed; streamed, each choice finishes on its own and the deltas add up."""
    prompts = ["Hello", PROMPT]
    body = cmpl(server, prompt=prompts, max_tokens=4)
    whole = server.post(ROUTE_PATHS["completions"], body).json()
    assert [c["index"] for c in whole["choices"]] == [0, 1]
    for prompt, choice in zip(prompts, whole["choices"], strict=True):
        alone = server.post(ROUTE_PATHS["completions"], cmpl(server, prompt=prompt, max_tokens=4))
        assert choice["text"] == alone.json()["choices"][0]["text"]
    usage = whole["usage"]
    assert usage["prompt_tokens"] == sum(len(server.tokenizer.encode(p)) for p in prompts)
    assert usage["completion_tokens"] == 8
    # One entry per step of the longest sequence; the two usually share every step.
    assert len(usage["batch_size"]) == len(usage["queue_wait_time"]) == 4
    assert set(usage["batch_size"]) <= {1, 2}
    chunks = sse_json(server.post(ROUTE_PATHS["completions"], {**body, "stream": True}), done=True)
    texts = {0: "", 1: ""}
    finished = []
    for chunk in chunks:
        [choice] = chunk["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"] is not None:
            finished.append(choice["index"])
    assert sorted(finished) == [0, 1]
    assert [texts[0], texts[1]] == [c["text"] for c in whole["choices"]]
    assert [("usage" in c) for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1]["usage"]["completion_tokens"] == 8


def test_databricks_truncate_cuts_the_prompt_from_the_left(server: Server) -> None:
    """``error_behavior: "truncate"`` keeps the last max-prompt tokens
    (docs/decisions.md#what-truncate-does); "error" is 400."""
    limit = server.ctx.limits.max_prompt_tokens
    prompt = " ".join(["fox"] * (2 * limit))
    assert len(server.tokenizer.encode(prompt)) > limit
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0}
    path = ROUTE_PATHS["databricks"]
    refused = server.post(path, {**body, "error_behavior": "error"})
    assert refused.status_code == 400
    assert "prompt" in refused.json()["message"]
    response = server.post(path, {**body, "error_behavior": "truncate"})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == limit
