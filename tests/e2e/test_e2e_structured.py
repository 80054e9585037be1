"""Structured output through the official OpenAI SDK against a real server on the default model:
50 seeded sampled requests at temperature 1 with a ``json_schema`` response format, sent at
once; every output that finished parses and validates against its schema (``jsonschema`` is
the oracle). ``json_object``, a regex and a choice constrain as asked; n > 1 and logprobs still
work.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai

from .e2e_support import MODEL

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["name", "age", "hobbies"],
    "additionalProperties": False,
}
PERSON = [{"role": "user", "content": "Describe a person as JSON."}]


def test_fifty_sampled_json_schema_outputs_validate(client: openai.OpenAI) -> None:
    def ask(seed: int) -> tuple[str, str]:
        response = client.chat.completions.create(
            model=MODEL,
            messages=PERSON,
            temperature=1.0,
            seed=seed,
            max_tokens=120,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": SCHEMA, "strict": True},
            },
        )
        (choice,) = response.choices
        return choice.message.content or "", choice.finish_reason

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(ask, range(50)))
    finished = [text for text, reason in results if reason == "stop"]
    assert len(finished) >= 45, results
    for text in finished:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert all(reason in ("stop", "length") for _, reason in results)


def test_json_object_regex_and_choice(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL,
        messages=PERSON,
        temperature=1.0,
        seed=3,
        n=2,
        logprobs=True,
        top_logprobs=2,
        max_tokens=160,
        response_format={"type": "json_object"},
    )
    assert len(response.choices) == 2
    for choice in response.choices:
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content or ""), dict)
        assert choice.logprobs is not None and choice.logprobs.content
    date = client.completions.create(
        model=MODEL,
        prompt="Today's date is",
        max_tokens=16,
        seed=5,
        extra_body={"guided_regex": r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"},
    )
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", date.choices[0].text)
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Is Paris in France?"}],
        temperature=0,
        max_tokens=8,
        extra_body={"guided_choice": ["yes", "no"]},
    )
    assert answer.choices[0].message.content == "yes"
