"""Prompt logprobs over HTTP: ``echo`` with ``logprobs`` on both completions routes, vLLM's
``prompt_logprobs`` on both ``/v1`` routes, ``max_tokens: 0`` with ``echo``, token-id prompts,
and the body lm-evaluation-harness's ``local-completions`` sends for a loglikelihood, checked
against transformers (the server runs a tiny model in float32)."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import torch
import transformers  # the oracle
from server_harness import MODEL, ROUTE_PATHS, Server, sse_json

PROMPT = "The quick brown fox jumps over"
CONTINUATION = " the lazy dog"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
CMPL = ROUTE_PATHS["completions"]


@cache
def oracle(server: Server) -> transformers.PreTrainedModel:
    path = server.engine.model_path
    assert path is not None
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def reference(server: Server, ids: list[int]) -> list[float]:
    """transformers' logprob of each token after the first, given the ones before it."""
    with torch.inference_mode():
        logits = oracle(server)(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return [logits[p - 1, ids[p]].item() for p in range(1, len(ids))]


def text_of(server: Server, token_id: int) -> str:
    return server.tokenizer.detokenizer.token_bytes(token_id).decode("utf-8", "replace")


def post(server: Server, body: dict[str, Any], path: str = CMPL) -> dict[str, Any]:
    response = server.post(path, body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


@pytest.mark.parametrize("k", [0, 2])
def test_echo_with_logprobs_puts_the_prompt_first(server: Server, k: int) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 3, "temperature": 0,
            "ignore_eos": True, "echo": True, "logprobs": k}  # fmt: skip
    [choice] = post(server, body)["choices"]
    ids = server.tokenizer.encode(PROMPT)
    lp = choice["logprobs"]
    n = len(ids)
    assert len(lp["tokens"]) == n + 3
    assert lp["tokens"][:n] == [text_of(server, t) for t in ids]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:n] == pytest.approx(reference(server, ids), abs=1e-3)
    assert all(isinstance(x, float) for x in lp["token_logprobs"][n:])
    assert lp["text_offset"] == [sum(map(len, lp["tokens"][:i])) for i in range(n + 3)]
    assert choice["text"].startswith(PROMPT) and len(choice["text"]) > len(PROMPT)
    for token, top in zip(lp["tokens"][1:n], lp["top_logprobs"][1:n], strict=True):
        assert token in top and len(top) in (k, k + 1)
    plain = post(server, {**body, "echo": False})["choices"][0]
    assert choice["text"] == PROMPT + plain["text"]
    assert lp["tokens"][n:] == plain["logprobs"]["tokens"]


def test_echo_logprobs_stream_in_the_first_chunk(server: Server) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0,
            "ignore_eos": True, "echo": True, "logprobs": 1}  # fmt: skip
    whole = post(server, body)["choices"][0]
    chunks = sse_json(server.post(CMPL, {**body, "stream": True}), done=True)
    joined: dict[str, list[Any]] = {}
    text = ""
    for chunk in chunks:
        [choice] = chunk["choices"]
        text += choice["text"]
        for key, values in (choice["logprobs"] or {}).items():
            joined.setdefault(key, []).extend(values)
    assert chunks[0]["choices"][0]["text"].startswith(PROMPT)
    assert text == whole["text"] and joined == whole["logprobs"]


def test_max_tokens_zero_with_echo_scores_the_prompt_only(server: Server) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1}
    result = post(server, body)
    [choice] = result["choices"]
    ids = server.tokenizer.encode(PROMPT)
    assert choice["text"] == PROMPT
    assert choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == len(ids)
    assert choice["logprobs"]["token_logprobs"][1:] == pytest.approx(
        reference(server, ids), abs=1e-3
    )
    assert result["usage"]["completion_tokens"] == 0
    assert result["usage"]["prompt_tokens"] == len(ids)
    refused = server.post(CMPL, {**body, "echo": False})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"


def check_vllm_prompt_logprobs(server: Server, entries: list[Any], ids: list[int], k: int) -> None:
    assert len(entries) == len(ids) and entries[0] is None
    want = reference(server, ids)
    for p in range(1, len(ids)):
        entry = entries[p]
        own = entry[str(ids[p])]
        assert own["logprob"] == pytest.approx(want[p - 1], abs=1e-3)
        assert own["decoded_token"] == text_of(server, ids[p])
        assert own["rank"] >= 1
        assert len(entry) in (k, k + 1)
        ranks = sorted(v["rank"] for key, v in entry.items() if key != str(ids[p]))
        assert ranks == list(range(1, len(ranks) + 1))


def test_prompt_logprobs_extra_on_completions(server: Server) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "n": 2, "temperature": 1.0,
            "seed": 3, "prompt_logprobs": 2}  # fmt: skip
    result = post(server, body)
    ids = server.tokenizer.encode(PROMPT)
    assert len(result["choices"]) == 2
    for choice in result["choices"]:
        check_vllm_prompt_logprobs(server, choice["prompt_logprobs"], ids, 2)
        assert choice["logprobs"] is None
    plain = post(server, {**body, "prompt_logprobs": None})
    assert "prompt_logprobs" not in plain["choices"][0]


def test_prompt_logprobs_extra_on_chat(server: Server) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2, "prompt_logprobs": 1}
    result = post(server, body, ROUTE_PATHS["chat"])
    ids = server.tokenizer.encode_chat(MESSAGES)
    check_vllm_prompt_logprobs(server, result["prompt_logprobs"], ids, 1)
    plain = post(server, {**body, "prompt_logprobs": None}, ROUTE_PATHS["chat"])
    assert "prompt_logprobs" not in plain


def test_token_id_prompts(server: Server) -> None:
    ids = server.tokenizer.encode(PROMPT)
    body = {"model": MODEL, "prompt": ids, "max_tokens": 3, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    by_ids = post(server, body)
    by_text = post(server, {**body, "prompt": PROMPT})
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]
    assert by_ids["usage"]["prompt_tokens"] == len(ids)
    echoed = post(server, {**body, "echo": True})["choices"][0]["text"]
    assert (
        echoed
        == server.tokenizer.decode(ids, skip_special_tokens=False) + (by_text["choices"][0]["text"])
    )
    other = server.tokenizer.encode("Hello world")
    batch = post(server, {**body, "prompt": [ids, other], "n": 2, "temperature": 1.0,
                          "seed": 1})  # fmt: skip
    assert [c["index"] for c in batch["choices"]] == [0, 1, 2, 3]
    assert batch["usage"]["prompt_tokens"] == len(ids) + len(other)
    bad = server.post(CMPL, {**body, "prompt": [*ids, 10**6]})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == f"prompt[{len(ids)}]"
    assert "`prompt[" in bad.json()["error"]["message"]


def test_databricks_completions_echo_with_logprobs(server: Server) -> None:
    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0, "echo": True, "logprobs": 1}
    [choice] = post(server, body, ROUTE_PATHS["databricks"])["choices"]
    ids = server.tokenizer.encode(PROMPT)
    lp = choice["logprobs"]
    assert choice["text"].startswith(PROMPT)
    assert lp["token_logprobs"][0] is None and len(lp["tokens"]) == len(ids) + 2
    assert lp["token_logprobs"][1 : len(ids)] == pytest.approx(reference(server, ids), abs=1e-3)
    plain = post(server, {"prompt": PROMPT, "max_tokens": 2}, ROUTE_PATHS["databricks"])
    assert "logprobs" not in plain["choices"][0]


@pytest.mark.parametrize("max_tokens", [0, 1])
@pytest.mark.parametrize("as_ids", [False, True])
def test_lm_eval_loglikelihood_body(server: Server, max_tokens: int, as_ids: bool) -> None:
    """lm-evaluation-harness ``local-completions`` scores a continuation by sending context +
    continuation with ``echo``, ``logprobs: 1`` and ``max_tokens`` 0 or 1, then summing
    ``token_logprobs`` over the continuation's tokens (dropping the generated one)."""
    context = server.tokenizer.encode(PROMPT)
    whole = server.tokenizer.encode(PROMPT + CONTINUATION)
    assert whole[: len(context)] == context
    body = {"model": MODEL, "prompt": whole if as_ids else PROMPT + CONTINUATION,
            "echo": True, "logprobs": 1, "max_tokens": max_tokens, "temperature": 0,
            "seed": 1234}  # fmt: skip
    [choice] = post(server, body)["choices"]
    token_logprobs = choice["logprobs"]["token_logprobs"]
    assert len(token_logprobs) == len(whole) + max_tokens
    got = sum(token_logprobs[len(context) : len(whole)])
    want = sum(reference(server, whole)[len(context) - 1 :])
    assert got == pytest.approx(want, abs=1e-3)
