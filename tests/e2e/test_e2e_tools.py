"""Tool calling through the official OpenAI SDK against a real server on the default model
(SmolLM2, whose chat template ignores ``tools``: the server offers them in a system prompt in
the Hermes format it detects). ``tool_choice`` "required" and a named function return parsed
calls whose arguments validate (``jsonschema`` is the oracle); streamed and whole responses
agree; MindIE's multi-turn round trip (docs/api/common.md#sample-bodies; history with ``tool_calls``
and a ``tool`` message) is answered."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai

from .e2e_support import MODEL

ORDER = {
    "type": "object",
    "properties": {"order_id": {"type": "string", "maxLength": 10}},
    "required": ["order_id"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
SCHEMAS = {"get_delivery_date": ORDER, "get_weather": WEATHER}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_delivery_date",
            "description": "Get the delivery date for a customer's order.",
            "parameters": ORDER,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": WEATHER,
        },
    },
]
ASK = [
    {"role": "system", "content": "You are a helpful customer support assistant."},
    {"role": "user", "content": "Hi, when will my order 12345 arrive?"},
]


def check(message: Any) -> list[tuple[str, dict[str, Any]]]:
    assert message.tool_calls, message
    out = []
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.function.name])
        out.append((call.function.name, arguments))
    return out


def test_required_and_named_choices_return_calls_that_validate(client: openai.OpenAI) -> None:
    def ask(seed: int) -> Any:
        choice: Any = (
            "required" if seed % 2 else {"type": "function", "function": {"name": "get_weather"}}
        )
        response = client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=TOOLS,
            tool_choice=choice,
            temperature=1.0,
            seed=seed,
            max_tokens=120,
        )
        return seed, response.choices[0]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, range(16)))
    finished = 0
    for seed, choice in results:
        if choice.finish_reason == "length":
            continue
        assert choice.finish_reason == "tool_calls", choice
        calls = check(choice.message)
        if seed % 2 == 0:
            assert [name for name, _ in calls] == ["get_weather"]
        finished += 1
    assert finished >= 12


def test_greedy_call_streamed_and_whole_agree(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=120,
    ).choices[0]
    assert whole.finish_reason == "tool_calls"
    check(whole.message)
    expected = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
    calls: dict[int, list[str]] = {}
    content = ""
    reason = None
    stream = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=120,
        stream=True,
    )
    for chunk in stream:
        (choice,) = chunk.choices
        content += choice.delta.content or ""
        for piece in choice.delta.tool_calls or []:
            if piece.id is not None:
                calls[piece.index] = [piece.function.name or "", ""]
            calls[piece.index][1] += piece.function.arguments or ""
        reason = choice.finish_reason or reason
    assert reason == "tool_calls"
    assert content == ""
    assert [(n, a) for n, a in (calls[i] for i in sorted(calls))] == expected


def test_spec_round_trip(client: openai.OpenAI) -> None:
    history: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "function": {"arguments": '{"order_id": "12345"}', "name": "get_delivery_date"},
                    "id": "tool_call_8p2Nk",
                    "type": "function",
                }
            ],
        },
        {
            "role": "tool",
            "content": "the delivery date is 2024.09.10.",
            "tool_call_id": "tool_call_8p2Nk",
        },
    ]
    response = client.chat.completions.create(
        model=MODEL,
        messages=history,
        tools=TOOLS,
        tool_choice="auto",
        temperature=0,
        max_tokens=40,
    )
    (choice,) = response.choices
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    if choice.message.tool_calls:
        check(choice.message)
    else:
        assert choice.message.content
        assert "<tool_call>" not in choice.message.content
