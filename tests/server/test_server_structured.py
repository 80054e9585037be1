"""Structured output over HTTP on a tiny random model, which left alone writes noise: every
constrained output must still parse and validate (``jsonschema`` is the oracle), on
``/v1/chat/completions``, ``/v1/completions`` and Databricks chat, streamed or not, with n > 1
and logprobs; vLLM's ``guided_*`` and ``structured_outputs`` extras constrain as asked; two
grammars, a malformed one or one built to explode are 400s naming the field.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
from server_harness import MODEL, ROUTE_PATHS, Server, sse_json

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000},
        "capital": {"type": "boolean"},
    },
    "required": ["city", "population", "capital"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
MESSAGES = [{"role": "user", "content": "Describe a city as JSON."}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MESSAGES, "max_tokens": 60, "temperature": 1.0, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "A city:", "max_tokens": 60, "temperature": 1.0, **fields}


def check_json(text: str, finish_reason: str, schema: dict[str, Any] | None) -> bool:
    """Whether ``text`` is a finished JSON value (validated against ``schema``); an output that
    ran into max_tokens may stop mid-value."""
    if finish_reason == "length":
        return False
    assert finish_reason == "stop", finish_reason
    value = json.loads(text)
    if schema is None:
        assert isinstance(value, dict)
    else:
        jsonschema.validate(value, schema)
    return True


def test_chat_json_schema_outputs_validate(server: Server) -> None:
    finished = 0
    for seed in range(6):
        body = chat(response_format=RESPONSE_FORMAT, seed=seed, n=2, logprobs=True, top_logprobs=2)
        response = server.post(ROUTE_PATHS["chat"], body)
        assert response.status_code == 200, response.text
        for choice in response.json()["choices"]:
            text = choice["message"]["content"]
            finished += check_json(text, choice["finish_reason"], SCHEMA)
            entries = choice["logprobs"]["content"]
            joined = b"".join(bytes(e["bytes"]) for e in entries).decode("utf-8", "replace")
            assert joined == text
    assert finished >= 6, "most outputs close their object within 60 tokens"


def test_streamed_and_whole_constrained_outputs_agree(server: Server) -> None:
    body = chat(response_format=RESPONSE_FORMAT, seed=11)
    whole = server.post(ROUTE_PATHS["chat"], body).json()["choices"][0]["message"]["content"]
    events = sse_json(server.post(ROUTE_PATHS["chat"], {**body, "stream": True}), done=True)
    streamed = "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]
    )
    assert streamed == whole
    check_json(whole, "stop", SCHEMA)


def test_completions_json_object_and_databricks_chat(server: Server) -> None:
    for seed in range(1, 5):  # completions seeds start at 1 (docs/api/openai.md#completions)
        body = completion(response_format={"type": "json_object"}, seed=seed)
        choice = server.post(ROUTE_PATHS["completions"], body).json()["choices"][0]
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(choice["text"]), dict)
        else:
            assert choice["text"].startswith("{")
    databricks = {"messages": MESSAGES, "max_tokens": 60, "response_format": RESPONSE_FORMAT}
    response = server.post(ROUTE_PATHS["databricks"], databricks)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    check_json(choice["message"]["content"], choice["finish_reason"], SCHEMA)


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"guided_regex": "[0-9]{3}-[a-z]{3}"}, lambda t: re.fullmatch("[0-9]{3}-[a-z]{3}", t)),
        ({"guided_choice": ["yes", "no", "maybe so"]}, lambda t: t in ("yes", "no", "maybe so")),
        ({"guided_json": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
        (
            {"guided_grammar": 'start: "a" NUM\nNUM: /[1-9][0-9]?/'},
            lambda t: re.fullmatch("a[1-9][0-9]?", t),
        ),
        (
            {"structured_outputs": {"regex": "(ab|cd){2,3}"}},
            lambda t: re.fullmatch("(ab|cd){2,3}", t),
        ),
        ({"structured_outputs": {"choice": ["left", "right"]}}, lambda t: t in ("left", "right")),
    ],
    ids=["regex", "choice", "json", "lark", "so-regex", "so-choice"],
)
def test_vllm_guided_extras_constrain(server: Server, extra: dict[str, Any], check: Any) -> None:
    # Room for the tiny model's multi-token characters: every output here must finish.
    bodies = (("completions", completion(**extra)), ("chat", chat(**extra)))
    for route, body in ((route, {**body, "max_tokens": 240}) for route, body in bodies):
        for seed in range(1, 4):
            response = server.post(ROUTE_PATHS[route], {**body, "seed": seed})
            assert response.status_code == 200, response.text
            choice = response.json()["choices"][0]
            text = choice["text"] if route == "completions" else choice["message"]["content"]
            assert choice["finish_reason"] == "stop", (route, text)
            assert check(text), (route, extra, text)


@pytest.mark.parametrize(
    ("route", "body", "param", "code"),
    [
        (
            "chat",
            chat(response_format=RESPONSE_FORMAT, guided_regex="a+"),
            "guided_regex",
            "conflict",
        ),
        (
            "completions",
            completion(guided_regex="((a{1000}){1000}){1000}"),
            "guided_regex",
            "too_complex",
        ),
        ("completions", completion(guided_regex="(unclosed"), "guided_regex", "invalid_grammar"),
        ("chat", chat(guided_choice=[]), "guided_choice", "empty"),
        ("chat", chat(guided_json="not json"), "guided_json", "invalid_format"),
        ("completions", completion(structured_outputs={}), "structured_outputs", "missing"),
        (
            "chat",
            chat(
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                }
            ),
            "response_format",
            "invalid_grammar",
        ),
        (
            "chat",
            chat(response_format={"type": "json_object"}, ignore_eos=True),
            "ignore_eos",
            "conflict",
        ),
    ],
    ids=[
        "two-grammars",
        "explosive-regex",
        "bad-regex",
        "no-choices",
        "bad-json",
        "empty-so",
        "bad-schema",
        "ignore-eos",
    ],
)
def test_bad_grammars_are_400_naming_the_field(
    server: Server, route: str, body: dict[str, Any], param: str, code: str
) -> None:
    response = server.post(ROUTE_PATHS[route], body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error
    # The server keeps serving.
    ok = server.post(ROUTE_PATHS["completions"], completion(max_tokens=2))
    assert ok.status_code == 200
