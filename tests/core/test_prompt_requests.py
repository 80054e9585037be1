"""Requests that score their prompt, and token-id prompts, as the validator hands them to
the handlers: parameters, switches and prompts (no torch)."""

from __future__ import annotations

from typing import Any

import pytest

from ferrollm import Limits, SamplingParams, ValidationError, validate

CMPL: dict[str, Any] = {"model": "m", "prompt": "hi"}
CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
LIMITS = Limits(vocab_size=100)


def test_echo_with_logprobs_is_served_and_scores_the_prompt() -> None:
    valid = validate("completions", {**CMPL, "echo": True, "logprobs": 2})
    assert valid.params.prompt_logprobs == 2 and valid.params.logprobs == 2
    assert valid.prompt_logprobs is None, "the vLLM field was not asked for"
    valid = validate("databricks_completions", {"prompt": "hi", "echo": True, "logprobs": 1})
    assert valid.params.prompt_logprobs == 1


def test_the_vllm_extra_on_both_v1_routes_and_offline() -> None:
    for route, body in (("completions", CMPL), ("chat", CHAT)):
        valid = validate(route, {**body, "prompt_logprobs": 3})
        assert (valid.prompt_logprobs, valid.params.prompt_logprobs) == (3, 3)
    assert SamplingParams(prompt_logprobs=0).prompt_logprobs == 0
    assert SamplingParams().prompt_logprobs is None
    with pytest.raises(ValidationError) as info:
        SamplingParams(prompt_logprobs=-1)
    assert info.value.param == "prompt_logprobs"


def test_max_tokens_zero_means_score_only_with_echo() -> None:
    valid = validate("completions", {**CMPL, "echo": True, "logprobs": 1, "max_tokens": 0})
    assert valid.score_only and valid.params.max_tokens == 1
    assert not validate("completions", {**CMPL, "echo": True}).score_only
    with pytest.raises(ValidationError) as info:
        validate("completions", {**CMPL, "max_tokens": 0})
    assert (info.value.param, info.value.code) == ("max_tokens", "out_of_range")
    assert "`echo: true`" in str(info.value)


@pytest.mark.parametrize(
    ("prompt", "prompts", "is_batch"),
    [
        ([5, 6, 7], [[5, 6, 7]], False),
        ([[5, 6], [7]], [[5, 6], [7]], True),
        (["a", "b"], ["a", "b"], True),
        ("a", ["a"], False),
    ],
)
def test_token_id_prompts(prompt: Any, prompts: list[Any], is_batch: bool) -> None:
    valid = validate("completions", {**CMPL, "prompt": prompt}, LIMITS)
    assert (valid.prompts, valid.is_batch) == (prompts, is_batch)


@pytest.mark.parametrize(
    ("prompt", "param", "code"),
    [
        ([5, 100], "prompt[1]", "out_of_range"),
        ([[5], [99, -1]], "prompt[1][1]", "out_of_range"),
        ([[5], []], "prompt[1]", "empty"),
        ([[5], "a"], "prompt[1]", "wrong_type"),
        ([5, "a"], "prompt[1]", "wrong_type"),
    ],
)
def test_bad_token_id_prompts_name_the_prompt(prompt: Any, param: str, code: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate("completions", {**CMPL, "prompt": prompt}, LIMITS)
    assert (info.value.param, info.value.code) == (param, code)
    assert str(info.value).startswith(f"`{param}`")
