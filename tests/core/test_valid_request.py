"""`ValidRequest`: one validation pass gives the parameters, the route switches and the
validated messages and prompts; the prompt-token rules are one call after tokenizing; unbuilt
features are refused from one table, by validation itself."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ferrollm import Limits, SamplingParams, ValidationError, validate

CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}


def test_switches_and_the_validated_objects() -> None:
    body = {"model": "m", "prompt": ["one", "two"], "stream": True, "echo": True}
    valid = validate("completions", body)
    assert (valid.route, valid.stream, valid.echo, valid.is_batch) == ("completions", 1, 1, 1)
    assert valid.model == "m"
    assert valid.prompts == body["prompt"]
    chat = {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}], "stream": False}
    chat["tool_choice"] = "none"
    valid = validate("chat", chat)
    assert valid.messages == chat["messages"]
    assert valid.tools == chat["tools"]
    assert (valid.stream, valid.prompts, valid.tool_choice) == (False, [], "none")
    gen = {"id": "c-1", "text_input": "hello", "parameters": {"details": True}}
    valid = validate("generate", gen)
    assert (valid.client_id, valid.details, valid.prompts) == ("c-1", True, ["hello"])
    assert validate("chat", CHAT).tools is None


def test_fit_prompt_caps_and_names_a_batch_prompt() -> None:
    limits = Limits(max_model_len=100, max_input_tokens=50, max_iter_times=80)
    valid = validate("completions", {"model": "m", "prompt": ["a", "b"]}, limits)
    assert valid.params.max_tokens == 80
    ids, params = valid.fit_prompt([5, 6, 7] * 10, index=1)
    assert ids.dtype == np.uint32 and ids.tolist() == [5, 6, 7] * 10
    assert params.max_tokens == 70
    with pytest.raises(ValidationError) as info:
        valid.fit_prompt(list(range(51)), index=1)
    assert (info.value.param, info.value.code) == ("prompt[1]", "too_long")
    assert str(info.value).startswith("`prompt[1]` must be at most 50 tokens")
    single = validate("completions", {"model": "m", "prompt": "a"}, limits)
    with pytest.raises(ValidationError) as info:
        single.with_prompt_tokens(0, index=0)
    assert info.value.param == "prompt"


def test_databricks_truncation_keeps_the_last_tokens() -> None:
    limits = Limits(max_model_len=100, max_input_tokens=4, max_iter_times=80)
    body = {"prompt": "x", "error_behavior": "truncate", "max_tokens": 200}
    valid = validate("databricks_completions", body, limits)
    assert valid.truncate
    ids, params = valid.fit_prompt([1, 2, 3, 4, 5, 6])
    assert ids.tolist() == [3, 4, 5, 6]
    assert params.max_tokens == 80
    strict = validate("databricks_completions", {"prompt": "x"}, limits)
    with pytest.raises(ValidationError):
        strict.fit_prompt([1, 2, 3, 4, 5, 6])


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("completions", {"model": "m", "prompt": "a", "suffix": "!"}, "suffix"),
    ],
)
def test_unbuilt_features_are_refused_by_field(route: str, body: Any, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate(route, body)  # a valid request that this build cannot serve yet
    assert (info.value.param, info.value.code) == (field, "unsupported")
    assert str(info.value).startswith(f"`{field}`: ")


def test_the_same_table_refuses_offline_parameters() -> None:
    SamplingParams(n=2, temperature=1.0)
    SamplingParams(n=1, best_of=2)  # built: ranked by cumulative logprob
    validate("completions", {"model": "m", "prompt": "a", "best_of": 3, "n": 2})
    # built: whether a server serves embeddings is its task (`--task embed`), not this table
    validate("databricks_embeddings", {"input": ["x"], "instruction": "y"})
    SamplingParams(use_beam_search=True, n=2)  # built: beam search
    with pytest.raises(ValidationError) as info:
        SamplingParams(use_beam_search=True, n=2, stop_token_ids=[1], top_p=0.5)
    assert (info.value.param, info.value.code) == ("top_p", "conflict")
