"""Tool calling over HTTP on a tiny random model with a Hermes-style chat template (it renders
``tools``, earlier ``tool_calls`` and tool results itself), which left alone writes noise: with
``tool_choice`` "required" or a named function every finished answer is calls whose arguments
validate against the function's schema (``jsonschema`` is the oracle); streamed and whole
responses agree; "auto" leaves text free but never lets a malformed call through; MindIE's
multi-turn round trip (docs/api/common.md#sample-bodies) works; Databricks' shape (content null) and
its 32-tool limit; conflicts and a server without a parser are 400s naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from server_harness import MODEL, ROUTE_PATHS, Server, sse_json

from ferrollm._core import validate
from ferrollm.server.app import App
from ferrollm.server.context import ServerContext
from ferrollm.server_config import ServerConfig
from tiny_models import build_tiny_model

# A Hermes-style template: tools in the system turn, calls as <tool_call> blocks, results as
# <tool_response> blocks in a user turn.
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "Functions you may call:\n<tools>\n{% for t in tools %}{{ t.function | tojson }}\n"
    '{% endfor %}</tools>\nCall one with <tool_call>\n{"name": ..., "arguments": ...}\n'
    "</tool_call><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}"
    "<|im_end|>\n{% endif %}"
    "{%- for m in messages %}{% if m.role == 'system' %}"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls %}<tool_call>\n"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n"
    "</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
}
TIME = {
    "type": "object",
    "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["tz"],
}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": schema}}
    for name, schema in SCHEMAS.items()
]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
TIME_CHOICE = {"type": "function", "function": {"name": "get_time"}}


@pytest.fixture(scope="module")
def hermes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    model_dir = build_tiny_model("llama3", tmp_path_factory.mktemp("hermes-model"))
    _set_context(model_dir, 4096)
    (model_dir / "chat_template.jinja").write_text(HERMES_TEMPLATE)
    server = Server(model_dir, max_model_len=2048, max_input_tokens=1500)
    yield server
    server.close()


def _set_context(model_dir: Path, length: int) -> None:
    """Room for the tool prompt (the tiny tokenizer spends about a token per character)."""
    config = json.loads((model_dir / "config.json").read_text())
    config["max_position_embeddings"] = length
    (model_dir / "config.json").write_text(json.dumps(config))


#: The tiny model's ``<|im_end|>`` favoured: the grammar allows it only once a call is
#: complete, so answers end after their first calls instead of running into max_tokens.
EOS_BIAS = {"2": 8.0}


def chat(**fields: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "max_tokens": 150}
    return {**body, "temperature": 1.0, "logit_bias": EOS_BIAS, **fields}


def check_calls(message: dict[str, Any], names: set[str]) -> list[tuple[str, Any]]:
    calls = message["tool_calls"]
    assert calls, message
    out = []
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        name = call["function"]["name"]
        assert name in names
        arguments = json.loads(call["function"]["arguments"])
        jsonschema.validate(arguments, SCHEMAS[name])
        out.append((name, arguments))
    return out


def test_required_answers_are_calls_that_validate(hermes: Server) -> None:
    finished = 0
    for seed in range(6):
        response = hermes.post(ROUTE_PATHS["chat"], chat(tool_choice="required", seed=seed))
        assert response.status_code == 200, response.text
        (choice,) = response.json()["choices"]
        if choice["finish_reason"] == "length":
            continue
        assert choice["finish_reason"] == "tool_calls", choice
        # the MindIE route's "" (docs/decisions.md#content-beside-tool-calls)
        assert choice["message"]["content"] == ""
        check_calls(choice["message"], set(SCHEMAS))
        finished += 1
    assert finished >= 5


def test_named_choice_is_one_call_of_that_function(hermes: Server) -> None:
    for seed in range(4):
        response = hermes.post(ROUTE_PATHS["chat"], chat(tool_choice=TIME_CHOICE, seed=seed))
        (choice,) = response.json()["choices"]
        assert choice["finish_reason"] == "tool_calls", choice
        ((name, arguments),) = check_calls(choice["message"], {"get_time"})
        assert name == "get_time" and arguments["tz"] in ("UTC", "CET")


def streamed(server: Server, body: dict[str, Any]) -> tuple[str, list[tuple[str, str]], str]:
    """Content, (name, arguments) per call and finish reason, joined from a stream."""
    response = server.post(ROUTE_PATHS["chat"], {**body, "stream": True})
    content, calls, reason = "", {}, None
    for event in sse_json(response, done=True):
        (choice,) = event["choices"]
        delta = choice["delta"]
        if delta.get("content"):
            content += delta["content"]
        for piece in delta.get("tool_calls") or []:
            if "id" in piece:
                assert piece["index"] not in calls and piece["type"] == "function"
                calls[piece["index"]] = [piece["function"]["name"], ""]
            calls[piece["index"]][1] += piece["function"]["arguments"]
        reason = choice["finish_reason"] or reason
    assert reason is not None
    return content, [(n, a) for n, a in (calls[i] for i in sorted(calls))], reason


@pytest.mark.parametrize("tool_choice", ["required", "auto", TIME_CHOICE])
def test_streamed_and_whole_answers_agree(hermes: Server, tool_choice: Any) -> None:
    for seed in range(3):
        body = chat(tool_choice=tool_choice, seed=seed)
        whole = hermes.post(ROUTE_PATHS["chat"], body).json()["choices"][0]
        content, calls, reason = streamed(hermes, body)
        assert reason == whole["finish_reason"]
        message = whole["message"]
        if message["tool_calls"]:
            expected = [
                (c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]
            ]
            assert calls == expected
            assert content == (message["content"] or "")
        else:
            assert calls == [] or reason == "length"
            assert "<tool_call>" not in content or reason == "length"


def test_auto_leaves_text_free_and_calls_well_formed(hermes: Server) -> None:
    for seed in range(6):
        response = hermes.post(ROUTE_PATHS["chat"], chat(tool_choice="auto", seed=seed))
        (choice,) = response.json()["choices"]
        message = choice["message"]
        if message["tool_calls"]:
            assert choice["finish_reason"] in ("tool_calls", "length")
            check_calls(message, set(SCHEMAS))
            assert "<tool_call>" not in (message["content"] or "")
        elif choice["finish_reason"] == "stop":
            assert "<tool_call>" not in message["content"]


def test_spec_round_trip_sample(hermes: Server) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_delivery_date",
                "strict": True,
                "description": "Get the delivery date for a customer's order.",
                "parameters": {
                    "type": "object",
                    "properties": {"order_id": {"type": "string", "maxLength": 8}},
                    "required": ["order_id"],
                    "additionalProperties": False,
                },
            },
        }
    ]
    history = [
        {"role": "system", "content": "You are a helpful customer support assistant."},
        {"role": "user", "content": "When does order 12345 arrive?"},
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
    body = {"model": MODEL, "messages": history, "tools": tools, "tool_choice": "auto"}
    response = hermes.post(
        ROUTE_PATHS["chat"], {**body, "max_tokens": 40, "temperature": 0.9, "seed": 1}
    )
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    assert choice["message"]["role"] == "assistant"
    # The history reached the model through the template: the call and the result.
    as_rendered = validate("chat", {"model": "m", "messages": history}).template_messages
    prompt = hermes.tokenizer.apply_chat_template(as_rendered, tools)
    assert (
        '<tool_call>\n{"name": "get_delivery_date", "arguments": {"order_id": "12345"}}' in prompt
    )
    assert "<tool_response>\nthe delivery date is 2024.09.10.\n</tool_response>" in prompt
    # Forcing the tool gives a call for the order.
    response = hermes.post(
        ROUTE_PATHS["chat"],
        {**body, "tool_choice": "required", "max_tokens": 150, "seed": 2, "logit_bias": EOS_BIAS},
    )
    (choice,) = response.json()["choices"]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_delivery_date"
    assert set(json.loads(call["function"]["arguments"])) == {"order_id"}


def test_databricks_calls_have_null_content(hermes: Server) -> None:
    body = {"messages": MESSAGES, "tools": TOOLS, "tool_choice": TIME_CHOICE, "max_tokens": 150}
    response = hermes.post(ROUTE_PATHS["databricks"], {**body, "temperature": 1.0, "seed": 3})
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    check_calls(choice["message"], set(SCHEMAS))
    # Without calls, Databricks leaves tool_calls out.
    plain = hermes.post(ROUTE_PATHS["databricks"], {"messages": MESSAGES, "max_tokens": 3})
    assert "tool_calls" not in plain.json()["choices"][0]["message"]


def test_databricks_refuses_a_33rd_tool(hermes: Server) -> None:
    tools = [
        {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}}
        for i in range(33)
    ]
    response = hermes.post(ROUTE_PATHS["databricks"], {"messages": MESSAGES, "tools": tools})
    assert response.status_code == 400
    assert "32" in response.text and "tools" in response.text
    body = {"messages": MESSAGES, "tools": tools[:32], "tool_choice": "none", "max_tokens": 2}
    ok = hermes.post(ROUTE_PATHS["databricks"], body)
    assert ok.status_code == 200, ok.text


def test_another_grammar_with_tools_is_a_conflict(hermes: Server) -> None:
    fmt = {"type": "json_object"}
    response = hermes.post(ROUTE_PATHS["chat"], chat(tool_choice="required", response_format=fmt))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "response_format" and error["code"] == "conflict"
    # With tool_choice "none" the tools are not called and the grammar applies.
    response = hermes.post(ROUTE_PATHS["chat"], chat(tool_choice="none", response_format=fmt))
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["tool_calls"] is None


def test_hostile_parameter_schema_is_a_400_and_the_server_keeps_serving(hermes: Server) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "type": "object",
                    "properties": {"x": {"type": "string", "pattern": "((a{100}){100}){100}"}},
                    "required": ["x"],
                },
            },
        }
    ]
    response = hermes.post(ROUTE_PATHS["chat"], chat(tools=tools, tool_choice="required"))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "tools"
    response = hermes.post(ROUTE_PATHS["chat"], chat(tool_choice=TIME_CHOICE, seed=0))
    assert response.status_code == 200


def test_a_server_without_a_parser_refuses_tools(hermes: Server) -> None:
    ctx = ServerContext.build(
        hermes.engine, ServerConfig(served_model_name=MODEL, tool_call_parser="none")
    )
    app = App(ctx=ctx)
    response = hermes.post(ROUTE_PATHS["chat"], chat(tool_choice="auto"), app=app)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "tools" and error["code"] == "unsupported"
    response = hermes.post(ROUTE_PATHS["chat"], chat(tool_choice="none", max_tokens=2), app=app)
    assert response.status_code == 200


def test_each_of_n_choices_reads_its_own_calls(hermes: Server) -> None:
    body = chat(tool_choice="required", seed=11, n=3)
    whole = hermes.post(ROUTE_PATHS["chat"], body).json()["choices"]
    assert len(whole) == 3
    for choice in whole:
        if choice["finish_reason"] == "tool_calls":
            check_calls(choice["message"], set(SCHEMAS))
    # Streamed, the chunks of the three interleave; each index re-assembles to its own calls.
    response = hermes.post(ROUTE_PATHS["chat"], {**body, "stream": True})
    calls: dict[int, dict[int, list[str]]] = {}
    for event in sse_json(response, done=True):
        for choice in event["choices"]:
            for piece in choice["delta"].get("tool_calls") or []:
                per = calls.setdefault(choice["index"], {})
                if "id" in piece:
                    per[piece["index"]] = [piece["function"]["name"], ""]
                per[piece["index"]][1] += piece["function"]["arguments"]
    for choice in whole:
        expected = [
            [c["function"]["name"], c["function"]["arguments"]]
            for c in choice["message"]["tool_calls"] or []
        ]
        got = calls.get(choice["index"], {})
        assert [got[i] for i in sorted(got)] == expected or choice["finish_reason"] == "length"
