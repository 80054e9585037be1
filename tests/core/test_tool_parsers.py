"""Tool-call parsers per family, on recorded texts: the content and calls read from the whole
text, the same read from the text streamed in every split (the property the streamed
``delta.tool_calls`` rely on: deltas re-assemble to the non-streamed result, and no markup
leaks into content), malformed calls refused, and the template detection."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from ferrollm.tools import FORMATS, Function, ToolStream, detect_format, history_messages

WEATHER = Function(
    "get_weather",
    "Weather for a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
)
TIME = Function("get_time", None, None)
FUNCTIONS = [WEATHER, TIME]

Calls = list[tuple[str, Any]]
# family, text, expected content, expected calls (name, arguments as an object)
RECORDED: list[tuple[str, str, str, Calls]] = [
    ("hermes", "Just text, no call.", "Just text, no call.", []),
    ("hermes", "a < b and <tool or <tool_ca", "a < b and <tool or <tool_ca", []),
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
        "</tool_call>",
        "",
        [("get_weather", {"city": "Paris", "days": 2})],
    ),
    (
        "hermes",
        'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "巴黎 \\"}{"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        "Let me check. ",
        [("get_weather", {"city": '巴黎 "}{'}), ("get_time", {})],
    ),
    (  # arguments sent as a JSON string; name after the arguments
        "hermes",
        '<tool_call>{"arguments": "{\\"city\\": \\"Rome\\"}", "name": "get_weather"}</tool_call>',
        "",
        [("get_weather", {"city": "Rome"})],
    ),
    ("llama3_json", "The answer is 4.", "The answer is 4.", []),
    (
        "llama3_json",
        '  {"name": "get_weather", "parameters": {"city": "Oslo"}}',
        "",
        [("get_weather", {"city": "Oslo"})],
    ),
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
        '{"name": "get_time", "parameters": {}}',
        "",
        [("get_weather", {"city": "Oslo"}), ("get_time", {})],
    ),
    ("mistral", "No tools [needed] here.", "No tools [needed] here.", []),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lima"}}, '
        '{"name": "get_time", "arguments": {}}]',
        "",
        [("get_weather", {"city": "Lima"}), ("get_time", {})],
    ),
    ("chatglm3", "\nHello! How can I help?", "Hello! How can I help?", []),
    ("chatglm3", "get_weathers are nice\nindeed", "get_weathers are nice\nindeed", []),
    (
        "chatglm3",
        'get_weather\n```python\ntool_call(city="Kyoto", days=3)\n```',
        "",
        [("get_weather", {"city": "Kyoto", "days": 3})],
    ),
]


def read_whole(family: str, text: str) -> tuple[str, Calls] | None:
    fmt = FORMATS[family](FUNCTIONS)
    stream = ToolStream(fmt, fmt.names)
    stream.feed(text, final=True)
    result = stream.result()
    if result is None:
        return None
    content, calls = result
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


def read_streamed(family: str, pieces: list[str]) -> tuple[str, list[tuple[str, str]]]:
    """Content and (name, arguments text) per call, joined from the deltas of ``pieces``."""
    fmt = FORMATS[family](FUNCTIONS)
    stream = ToolStream(fmt, fmt.names)
    content = ""
    calls: dict[int, list[str]] = {}
    for i, piece in enumerate(pieces):
        delta = stream.feed(piece, final=i == len(pieces) - 1)
        content += delta.content
        for d in delta.calls:
            if d.index not in calls:
                assert d.id is not None and d.id.startswith("call_") and d.name is not None
                calls[d.index] = [d.name, ""]
            else:
                assert d.id is None and d.name is None  # id and name come once, first
            calls[d.index][1] += d.arguments
    return content, [(name, args) for name, args in (calls[i] for i in sorted(calls))]


@pytest.mark.parametrize(("family", "text", "content", "calls"), RECORDED)
def test_whole_text_reads_content_and_calls(
    family: str, text: str, content: str, calls: Calls
) -> None:
    assert read_whole(family, text) == (content, calls)


def splits(text: str, seed: int) -> list[list[str]]:
    """Every split in two, every split into single characters, and random splits."""
    out = [[text[:i], text[i:]] for i in range(len(text) + 1)]
    out.append(list(text))
    rng = random.Random(seed)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return out


@pytest.mark.parametrize(("family", "text", "content", "calls"), RECORDED)
def test_streamed_deltas_reassemble_to_the_whole_result(
    family: str, text: str, content: str, calls: Calls
) -> None:
    fmt = FORMATS[family](FUNCTIONS)
    whole = ToolStream(fmt, fmt.names)
    whole.feed(text, final=True)
    result = whole.result()
    assert result is not None
    expected = (result[0], [(c.name, c.arguments) for c in result[1]])
    for pieces in splits(text, seed=len(text)):
        assert read_streamed(family, pieces) == expected, pieces
        if calls:  # no markup ever reaches the content
            streamed_content = read_streamed(family, pieces)[0]
            for marker in ("<tool_call>", "[TOOL_CALLS]", "{", "tool_call("):
                assert marker not in streamed_content


@pytest.mark.parametrize(
    ("family", "text"),
    [
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'),  # cut off
        ("hermes", '<tool_call>\n{"name": "launch_rockets", "arguments": {}}\n</tool_call>'),
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>'),
        ("hermes", "<tool_call>\nnot json\n</tool_call>"),
        ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Oslo"}} and more'),
        ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": '),
        ("chatglm3", "get_weather\n```python\ntool_call(city=open('x'))\n```"),
    ],
)
def test_malformed_calls_are_not_calls(family: str, text: str) -> None:
    assert read_whole(family, text) is None


@pytest.mark.parametrize(
    ("template", "family"),
    [
        ("{% for m in messages %}<tool_call>{{ tools }}{% endfor %}", "hermes"),
        ("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]", "mistral"),
        ("<|start_header_id|>ipython<|end_header_id|> {{ parameters }}", "llama3_json"),
        ("<|system|>{{ tools }}<|observation|>", "chatglm3"),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", "hermes"),
        (None, "hermes"),
    ],
)
def test_family_detected_from_the_template(template: str | None, family: str) -> None:
    assert detect_format(template) == family


def test_history_writes_calls_and_results_for_templates_without_tools() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    plain = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    out = history_messages("hermes", plain, messages)
    assert out[1]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert "tool_calls" not in out[1]
    assert out[2]["content"] == "<tool_response>\nsunny\n</tool_response>"
    # A template that renders tool calls itself gets the messages unchanged.
    assert history_messages("hermes", "{{ m.tool_calls }}", messages) == messages


def test_the_config_knows_every_parser() -> None:
    from ferrollm.config import TOOL_CALL_PARSERS, EngineConfigError
    from ferrollm.server_config import ServerConfig
    from ferrollm.tools import PARSER_CHOICES

    assert TOOL_CALL_PARSERS == PARSER_CHOICES
    with pytest.raises(EngineConfigError) as info:
        ServerConfig(tool_call_parser="qwen")
    assert info.value.field == "tool_call_parser"
