"""Request validation through the binding: `validate()`, `Limits` and `SamplingParams`."""

import json
from typing import Any

import numpy as np
import pytest

from ferrollm import Limits, SamplingParams, ValidationError, validate


class Err:
    """Expected failure: a ValidationError on `param` with `code`."""

    def __init__(self, param: str, code: str) -> None:
        self.param = param
        self.code = code


def approx(value: Any) -> Any:
    """Floats are stored as f32: compare them approximately, everything else exactly."""
    return pytest.approx(value) if isinstance(value, float) else value


def validated(
    route: str, body: Any, num_prompt_tokens: Any = None, limits: Limits | None = None
) -> SamplingParams:
    """`validate`, then with a token count the prompt-token rules: what the engine gets."""
    valid = validate(route, body, limits)
    if num_prompt_tokens is None:
        return valid.params
    return valid.with_prompt_tokens(num_prompt_tokens)


def check(route: str, body: Any, expected: Any, **kwargs: Any) -> SamplingParams | None:
    """Validate `body` and compare with `expected`: an Err, or a dict of attribute values."""
    if isinstance(expected, Err):
        with pytest.raises(ValidationError) as info:
            validated(route, body, **kwargs)
        assert (info.value.param, info.value.code) == (expected.param, expected.code), info.value
        assert str(info.value).startswith(f"`{expected.param}`")
        return None
    params = validated(route, body, **kwargs)
    for name, value in expected.items():
        assert getattr(params, name) == approx(value), name
    return params


# The vendor documents' sample request bodies, verbatim (docs/api/common.md#sample-bodies).
GENERATE_SAMPLE = """{
    "id":"a123",
    "text_input": "My name is Olivier and I",
    "parameters": {
        "details": true, "do_sample": true, "max_new_tokens":20, "repetition_penalty": 1.1,
        "seed": 123, "temperature": 1, "top_k": 10, "top_p": 0.99, "batch_size":100,
        "typical_p": 0.5, "watermark": false, "perf_stat": false, "priority": 5, "timeout": 10
    }
}"""
CHAT_SAMPLE = """{
    "model": "gpt-3.5-turbo",
    "messages": [{"role": "user", "content": "You are a helpful assistant."}],
    "stream": false, "presence_penalty": 1.03, "frequency_penalty": 1.0,
    "repetition_penalty": 1.0, "temperature": 0.5, "top_p": 0.95, "top_k": -1, "seed": null,
    "stop": ["stop1", "stop2"], "stop_token_ids": [2, 13], "include_stop_str_in_output": false,
    "skip_special_tokens": true, "ignore_eos": false, "max_tokens": 20
}"""
CHAT_TOOL_ROUND_TRIP = """{
    "model": "llama_65b",
    "messages": [
        {"role": "system", "content": "You are a helpful customer support assistant."},
        {"role": "user", "content": "Hi, can you tell me the delivery date for my order?"},
        {"role": "assistant", "tool_calls": [{"function": {
            "arguments": "{\\"order_id\\": \\"12345\\"}", "name": "get_delivery_date"},
            "id": "tool_call_8p2Nk", "type": "function"}]},
        {"role": "tool", "content": "the delivery date is 2024.09.10.",
         "tool_call_id": "tool_call_8p2Nk"}
    ],
    "stream": false, "repetition_penalty": 1.1, "temperature": 0.9, "top_p": 1,
    "max_tokens": 1024,
    "tools": [{"type": "function", "function": {"name": "get_delivery_date", "strict": true,
        "description": "Get the delivery date for a customer's order.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string",
            "description": "The customer's order ID."}}, "required": ["order_id"],
            "additionalProperties": false}}}],
    "tool_choice": "auto"
}"""
COMPLETIONS_BEAM = """{"model": "Qwen2.5-7B-Instruct", "prompt": "who are you", "temperature": 1,
    "max_tokens": 5, "use_beam_search": true, "ignore_eos":true, "n": 2, "best_of":2,
    "stream": true, "logprobs": 2}"""
COMPLETIONS_SAMPLING = """{"model": "llama", "prompt": "who are you", "temperature": 1,
    "max_tokens": 5, "ignore_eos":true, "n": 2, "best_of":2, "stream": false, "logprobs": 2}"""
DATABRICKS_CHAT = """{
  "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the delivery date for order 12345?"}
  ],
  "max_tokens": 256, "temperature": 0.2,
  "tools": [{"type": "function", "function": {"name": "get_delivery_date",
    "description": "Look up an order's delivery date", "parameters": {"type": "object",
    "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}],
  "tool_choice": "auto", "logprobs": true, "top_logprobs": 2
}"""
DATABRICKS_COMPLETIONS = """{"prompt": ["Once upon a time", "The capital of France is"],
    "max_tokens": 8, "temperature": 0, "suffix": "", "echo": false}"""
DATABRICKS_EMBEDDINGS = """{"input": ["first chunk", "second chunk"],
    "instruction": "Represent this sentence for searching relevant passages:"}"""


@pytest.mark.parametrize(
    ("route", "text", "expected"),
    [
        (
            "generate_stream",
            GENERATE_SAMPLE,
            {"temperature": 1.0, "top_k": 10, "top_p": 0.99, "seed": 123, "max_tokens": 20},
        ),
        ("generate", GENERATE_SAMPLE, {"priority": 5, "timeout_s": 10.0, "typical_p": 1.0}),
        (
            "chat",
            CHAT_SAMPLE,
            {"top_k": 0, "seed": None, "stop": ["stop1", "stop2"], "stop_token_ids": [2, 13]},
        ),
        ("chat", CHAT_TOOL_ROUND_TRIP, {"temperature": 0.9, "max_tokens": 1024}),
        (
            "completions",
            COMPLETIONS_BEAM,
            {"use_beam_search": True, "n": 2, "best_of": 2, "logprobs": 2, "max_tokens": 5},
        ),
        ("completions", COMPLETIONS_SAMPLING, {"n": 2, "best_of": 2, "ignore_eos": True}),
        ("databricks_chat", DATABRICKS_CHAT, {"max_tokens": 256, "logprobs": 2}),
        ("databricks_completions", DATABRICKS_COMPLETIONS, {"temperature": 0.0, "max_tokens": 8}),
        ("databricks_embeddings", DATABRICKS_EMBEDDINGS, {"max_tokens": None}),
    ],
)
def test_spec_samples_are_accepted(route: str, text: str, expected: dict[str, Any]) -> None:
    check(route, json.loads(text), expected)


def test_media_on_a_text_only_model() -> None:
    body = json.loads(CHAT_SAMPLE)
    body["messages"][0]["content"] = [
        {"type": "text", "text": "My name is Olivier and I"},
        {"type": "image_url", "image_url": "/xxxx/test.png"},
    ]
    check("chat", body, Err("messages[0].content[1].type", "unsupported_content_type"))
    assert validated("chat", body, limits=Limits(multimodal=True)).max_tokens == 20


GEN = {"text_input": "hello"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
CMPL = {"model": "m", "prompt": "hi"}


def gen(**parameters: Any) -> dict[str, Any]:
    return {**GEN, "parameters": parameters}


@pytest.mark.parametrize(
    ("route", "body", "expected"),
    [
        # huge integers: range errors, never OverflowError
        ("generate", gen(seed=2**64 - 1), {"seed": 2**64 - 1}),
        ("generate", gen(seed=2**64), Err("parameters.seed", "out_of_range")),
        ("generate", gen(seed=2**70), Err("parameters.seed", "out_of_range")),
        ("generate", gen(seed=2**200), Err("parameters.seed", "out_of_range")),
        ("generate", gen(seed=0), Err("parameters.seed", "out_of_range")),
        ("chat", {**CHAT, "seed": 0}, {"seed": 0}),
        ("completions", {**CMPL, "seed": 0}, Err("seed", "out_of_range")),
        ("chat", {**CHAT, "max_tokens": -(2**100)}, Err("max_tokens", "out_of_range")),
        # integer fields: integral floats pass; fractions, strings and bools do not
        ("generate", gen(max_new_tokens=5.0), {"max_tokens": 5}),
        ("generate", gen(max_new_tokens=5.5), Err("parameters.max_new_tokens", "wrong_type")),
        ("generate", gen(max_new_tokens="5"), Err("parameters.max_new_tokens", "wrong_type")),
        ("generate", gen(max_new_tokens=True), Err("parameters.max_new_tokens", "wrong_type")),
        ("generate", gen(seed=1e300), Err("parameters.seed", "wrong_type")),
        # float fields take ints; bool fields take only bools
        ("generate", gen(temperature=2, do_sample=True), {"temperature": 2.0}),
        ("generate", gen(temperature=True), Err("parameters.temperature", "wrong_type")),
        ("chat", {**CHAT, "temperature": float("nan")}, Err("temperature", "out_of_range")),
        ("chat", {**CHAT, "temperature": float("inf")}, Err("temperature", "out_of_range")),
        ("chat", {**CHAT, "stream": 1}, Err("stream", "wrong_type")),
        ("chat", {**CHAT, "ignore_eos": "false"}, Err("ignore_eos", "wrong_type")),
        # null = absent; required fields must not be null
        ("generate", gen(temperature=None, max_new_tokens=None), {"max_tokens": 20}),
        ("chat", {**CHAT, "n": None, "stop": None, "top_k": None}, {"n": 1, "top_k": 0}),
        ("generate", {"text_input": None}, Err("text_input", "missing")),
        ("chat", {**CHAT, "model": None}, Err("model", "missing")),
        ("chat", {"model": "m"}, Err("messages", "missing")),
        # per-route ranges
        ("generate", gen(temperature=0), Err("parameters.temperature", "out_of_range")),
        ("generate", gen(typical_p=-1.0), Err("parameters.typical_p", "out_of_range")),
        ("generate", gen(top_k=-1), Err("parameters.top_k", "out_of_range")),
        ("chat", {**CHAT, "top_k": 0}, Err("top_k", "out_of_range")),
        ("chat", {**CHAT, "top_k": -1}, {"top_k": 0}),
        ("completions", {**CMPL, "top_p": 1e-6}, Err("top_p", "out_of_range")),
        (
            "databricks_chat",
            {"messages": CHAT["messages"], "temperature": 2.5},
            Err("temperature", "out_of_range"),
        ),
        ("databricks_chat", {"messages": CHAT["messages"], "top_p": 0}, {"temperature": 0.0}),
        # stops
        ("chat", {**CHAT, "stop": ["a", ""]}, Err("stop[1]", "empty")),
        ("chat", {**CHAT, "stop": "x" * 32769}, Err("stop", "too_long")),
        ("chat", {**CHAT, "stop": ["x" * 16384] * 2}, {"stop": ["x" * 16384] * 2}),
        ("chat", {**CHAT, "stop_token_ids": [1, None]}, Err("stop_token_ids[1]", "wrong_type")),
        ("chat", {**CHAT, "stop_token_ids": [1, 2**31, -4]}, {"stop_token_ids": [1]}),
        # cross-field rules
        ("chat", {**CHAT, "top_logprobs": 3}, Err("top_logprobs", "conflict")),
        ("chat", {**CHAT, "n": 2, "temperature": 0}, Err("temperature", "conflict")),
        ("completions", {**CMPL, "n": 3, "best_of": 2}, Err("best_of", "conflict")),
        ("completions", {**CMPL, "stream": True, "best_of": 2}, Err("best_of", "conflict")),
        ("completions", {**CMPL, "stream": True, "best_of": 1}, {"best_of": 1}),
        ("completions", {**CMPL, "use_beam_search": True, "stop": "x"}, Err("stop", "conflict")),
        ("chat", {**CHAT, "tool_choice": "required"}, Err("tool_choice", "conflict")),
        # generate id pattern
        ("generate", {**GEN, "id": "a" * 256}, {}),
        ("generate", {**GEN, "id": "a" * 257}, Err("id", "invalid_format")),
        # tuples are lists
        ("chat", {**CHAT, "stop": ("a", "b")}, {"stop": ["a", "b"]}),
    ],
)
def test_validate_table(route: str, body: dict[str, Any], expected: Any) -> None:
    check(route, body, expected)


def test_body_conversion_errors_name_the_path() -> None:
    with pytest.raises(ValidationError) as info:
        validate("chat", {**CHAT, "logit_bias": {5: 1.0}})
    assert (info.value.param, info.value.code) == ("logit_bias", "wrong_type")
    with pytest.raises(ValidationError) as info:
        validate("chat", {**CHAT, "messages": [{"role": "user", "content": object()}]})
    assert (info.value.param, info.value.code) == ("messages[0].content", "wrong_type")
    deep: Any = "x"
    for _ in range(100):
        deep = [deep]
    with pytest.raises(ValidationError) as info:
        validate("chat", {**CHAT, "stop": deep})
    assert info.value.code == "invalid_format"
    with pytest.raises(ValidationError) as info:
        validate("chat", [1, 2])  # type: ignore[arg-type]
    assert (info.value.param, info.value.code) == ("body", "wrong_type")
    with pytest.raises(ValidationError) as info:
        validate("v1/chat", CHAT)
    assert info.value.param == "route"


def test_numpy_values_are_accepted() -> None:
    body = {
        **CHAT,
        "stop_token_ids": np.array([3, 4]),
        "seed": np.uint64(2**63),
        "top_p": np.float32(0.5),
    }
    params = validated("chat", body)
    assert params.stop_token_ids == [3, 4]
    assert params.seed == 2**63
    assert params.top_p == pytest.approx(0.5)


def test_prompt_tokens_and_output_cap() -> None:
    limits = Limits(max_model_len=4096, max_input_tokens=4000, max_iter_times=1000)
    assert validated("chat", CHAT, limits=limits).max_tokens == 1000
    assert validated("chat", CHAT, 3500, limits).max_tokens == 596
    assert validated("generate", GEN, 3500, limits).max_tokens == 20
    assert (
        validated("databricks_chat", {"messages": CHAT["messages"]}, 10, limits).max_tokens == 1000
    )
    for tokens, code in [(4001, "too_long"), (0, "empty")]:
        with pytest.raises(ValidationError) as info:
            validated("chat", CHAT, tokens, limits)
        assert (info.value.param, info.value.code) == ("messages", code)
    for bad in [-1, 2**40]:
        with pytest.raises(ValidationError) as info:
            validated("chat", CHAT, bad, limits)
        assert info.value.param == "num_prompt_tokens"


def test_limits() -> None:
    limits = Limits()
    assert (limits.max_model_len, limits.max_prompt_chars, limits.max_stop_chars) == (
        8192,
        4 * 1024 * 1024,
        32768,
    )
    assert (limits.vocab_size, limits.multimodal, limits.databricks_endpoint_type) == (
        0,
        False,
        None,
    )
    custom = Limits(
        vocab_size=100, max_position_embeddings=64, databricks_endpoint_type="pay_per_token"
    )
    assert (custom.vocab_size, custom.max_position_embeddings) == (100, 64)
    assert custom.databricks_endpoint_type == "pay_per_token"
    assert custom == Limits(
        vocab_size=100, max_position_embeddings=64, databricks_endpoint_type="pay_per_token"
    )
    assert "Limits(" in repr(custom)
    # min(max_input_tokens, max_model_len - 1, max_position_embeddings, 1M)
    assert Limits().max_prompt_tokens == 8191
    assert custom.max_prompt_tokens == 64
    assert Limits(max_input_tokens=100, max_model_len=50).max_prompt_tokens == 49
    with pytest.raises(AttributeError):
        custom.vocab_size = 5  # type: ignore[misc]
    body = {"messages": CHAT["messages"], "n": 2}
    with pytest.raises(ValidationError) as info:
        validated("databricks_chat", body, limits=custom)
    assert (info.value.param, info.value.code) == ("n", "unsupported")
    with pytest.raises(ValidationError) as info:
        validate("chat", {**CHAT, "stop_token_ids": [1], "logit_bias": {"100": 1}}, limits=custom)
    assert info.value.param == "logit_bias.100"


@pytest.mark.parametrize(
    ("kwargs", "param", "code"),
    [
        ({"max_n": 0}, "max_n", "out_of_range"),
        ({"max_model_len": 1}, "max_model_len", "out_of_range"),
        ({"vocab_size": -1}, "vocab_size", "out_of_range"),
        ({"vocab_size": 2**70}, "vocab_size", "out_of_range"),
        ({"vocab_size": True}, "vocab_size", "wrong_type"),
        ({"multimodal": 1}, "multimodal", "wrong_type"),
        ({"databricks_endpoint_type": "free"}, "databricks_endpoint_type", "invalid_value"),
    ],
)
def test_limits_errors(kwargs: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(ValidationError) as info:
        Limits(**kwargs)
    assert (info.value.param, info.value.code) == (param, code)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, {"best_of": 1, "temperature": 1.0, "top_p": 1.0, "priority": 5, "seed": None}),
        ({"n": 3}, {"best_of": 3}),
        ({"n": None, "temperature": None}, {"n": 1, "temperature": 1.0}),
        ({"top_k": -1}, {"top_k": 0}),
        ({"temperature": 0, "top_p": 0.5}, {"temperature": 0.0, "top_p": 1.0}),
        ({"seed": 2**64 - 1, "logprobs": 20}, {"seed": 2**64 - 1, "logprobs": 20}),
        ({"logit_bias": {7: -100, 3: 2.5}}, {"logit_bias": {3: 2.5, 7: -100.0}}),
        ({"allowed_token_ids": [5, 1, 5]}, {"allowed_token_ids": [1, 5]}),
        (
            {"bad_words": [[1, 2]], "stop_token_sequences": ((3,),)},
            {"bad_words": [[1, 2]], "stop_token_sequences": [[3]]},
        ),
        ({"embedding_bias": np.zeros(4, dtype=np.float32)}, {"embedding_bias": [0.0] * 4}),
        (
            {"stop": "x", "include_stop_str_in_output": True},
            {"stop": ["x"], "include_stop_str_in_output": True},
        ),
        ({"include_stop_str_in_output": True}, {"include_stop_str_in_output": False}),
        ({"timeout_s": 2.5, "priority": 1}, {"timeout_s": 2.5, "priority": 1}),
        ({"use_beam_search": True, "n": 2, "best_of": 4}, {"use_beam_search": True, "best_of": 4}),
        (
            {"min_p": 1, "typical_p": 0.5, "no_repeat_ngram_size": 3},
            {"min_p": 1.0, "no_repeat_ngram_size": 3},
        ),
        ({"n": 2**70}, Err("n", "out_of_range")),
        ({"seed": -1}, Err("seed", "out_of_range")),
        ({"seed": 2**64}, Err("seed", "out_of_range")),
        ({"stop_token_ids": [-1]}, Err("stop_token_ids[0]", "out_of_range")),
        ({"stop_token_ids": [2**32]}, Err("stop_token_ids[0]", "out_of_range")),
        ({"n": 3, "best_of": 2}, Err("best_of", "conflict")),
        ({"n": 2, "temperature": 0}, Err("temperature", "conflict")),
        ({"top_p": 0}, Err("top_p", "out_of_range")),
        ({"logit_bias": {1: 101}}, Err("logit_bias.1", "out_of_range")),
        ({"logit_bias": {"a": 1}}, Err("logit_bias.a", "invalid_format")),
        ({"timeout_s": 0}, Err("timeout_s", "out_of_range")),
        ({"ignore_eos": 1}, Err("ignore_eos", "wrong_type")),
        ({"temperature": "hot"}, Err("temperature", "wrong_type")),
        ({"max_tokens": 2.5}, Err("max_tokens", "wrong_type")),
    ],
)
def test_sampling_params_constructor(kwargs: dict[str, Any], expected: Any) -> None:
    if isinstance(expected, Err):
        with pytest.raises(ValidationError) as info:
            SamplingParams(**kwargs)
        assert (info.value.param, info.value.code) == (expected.param, expected.code)
        return
    params = SamplingParams(**kwargs)
    for name, value in expected.items():
        assert getattr(params, name) == approx(value), name
    assert params == SamplingParams(**kwargs)
    assert repr(params).startswith("SamplingParams(n=")


def test_sampling_params_rejects_unknown_and_positional_arguments() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_new_tokens'"):
        SamplingParams(max_new_tokens=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        SamplingParams(1)  # type: ignore[misc]
    assert SamplingParams(n=2) != SamplingParams(n=3)


def test_offline_route_matches_the_constructor() -> None:
    kwargs = {"n": 2, "temperature": 0.5, "stop": ["x"], "seed": 9}
    assert validated("offline", kwargs) == SamplingParams(**kwargs)
