"""Reasoning output (docs/api/openai.md#reasoning): the ``deepseek_r1`` and ``qwen3`` splits of
recorded thinking-model outputs, the same whole and streamed at every byte boundary; the
parser picked from the chat template; the answer grammar that lets reasoning run free and holds
what follows ``</think>``; and over the wire with the ``openai`` SDK: ``reasoning_content``
streamed and whole, tool calls read after the reasoning, ``chat_template_kwargs`` reaching the
template, and Databricks keeping the reasoning in its text."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_harness import MODEL, ROUTE_PATHS, Server, sse_json

from ferrollm._core import Detokenizer, GrammarCompiler
from ferrollm.config import EngineConfigError
from ferrollm.engine import CompletionOutput, RequestOutput
from ferrollm.engine.outputs import SequenceState
from ferrollm.reasoning import (
    ReasoningPlan,
    opened_by_prompt,
    resolve_reasoning_parser,
)
from ferrollm.server.app import App
from ferrollm.server.context import ServerContext
from ferrollm.server_config import ServerConfig
from tiny_models import build_tiny_model, build_tiny_tokenizer

# Recorded outputs (shortened) of DeepSeek-R1 (its template writes "<think>\n" into the
# prompt), DeepSeek-R1-0528 and Qwen3 (which write it themselves), and of Qwen3 with
# enable_thinking false; the last ran into max_tokens mid-thought.
R1 = "Okay, 2 + 2: add them.\n</think>\n\nThe answer is **4**."
R1_0528 = "<think>\nThe user greets me; reply kindly.\n</think>\n\nHello! 你好 😊"
QWEN3 = '<think>\nNeed the weather tool.\n</think>\n\n<tool_call>\n{"name": "w"}\n</tool_call>'
QWEN3_OFF = "Paris is the capital of France. Not </think> reasoning."
CUT_OFF = "<think>\nLet me think about 你 and </thi"

# (parser, prompt opened the reasoning, output, reasoning, content)
CASES = [
    ("deepseek_r1", True, R1, "Okay, 2 + 2: add them.\n", "\n\nThe answer is **4**."),
    ("deepseek_r1", True, R1_0528, "\nThe user greets me; reply kindly.\n", "\n\nHello! 你好 😊"),
    ("deepseek_r1", True, CUT_OFF, "\nLet me think about 你 and </thi", None),
    ("deepseek_r1", True, "</think>", "", None),
    ("deepseek_r1", True, "", "", None),
    ("qwen3", False, QWEN3, "\nNeed the weather tool.\n", QWEN3.split("</think>")[1]),
    ("qwen3", False, QWEN3_OFF, None, QWEN3_OFF),
    ("qwen3", False, "<thin", None, "<thin"),
    ("qwen3", False, CUT_OFF, "\nLet me think about 你 and </thi", None),
    ("qwen3", True, R1, "Okay, 2 + 2: add them.\n", "\n\nThe answer is **4**."),
    ("qwen3", False, "", None, ""),
]


def _streamed(plan: ReasoningPlan, data: bytes, cuts: list[int]) -> tuple[Any, ...]:
    """The reasoning and content pieces joined, and the stream's own result, for ``data`` fed
    in pieces cut at ``cuts`` (bytes; a cut inside a character holds its bytes back, as the
    detokenizer does)."""
    stream = plan.stream()
    reasoning, content = "", ""
    bounds = [0, *cuts, len(data)]
    sent = 0
    for end in bounds[1:]:
        text = data[:end].decode("utf-8", "ignore")
        piece = stream.feed(text[sent:], final=end == len(data))
        sent = len(text)
        reasoning += piece.reasoning
        content += piece.content
    return reasoning, content, stream.result()


@pytest.mark.parametrize(("parser", "opened", "output", "reasoning", "content"), CASES)
def test_whole_split_follows_the_parser(
    parser: str, opened: bool, output: str, reasoning: str | None, content: str | None
) -> None:
    assert ReasoningPlan(parser, opened).split(output) == (reasoning, content)


@pytest.mark.parametrize(("parser", "opened", "output", "reasoning", "content"), CASES)
def test_every_byte_split_streams_the_whole_split(
    parser: str, opened: bool, output: str, reasoning: str | None, content: str | None
) -> None:
    plan = ReasoningPlan(parser, opened)
    data = output.encode()
    whole = (reasoning or "", content or "", (reasoning, content))
    for cut in range(len(data) + 1):
        assert _streamed(plan, data, [cut]) == whole, cut
    for cut in range(1, len(data)):
        assert _streamed(plan, data, list(range(cut, len(data), cut))) == whole, cut


def test_no_delta_carries_part_of_a_tag() -> None:
    stream = ReasoningPlan("deepseek_r1", True).stream()
    assert stream.feed("step one </thi").reasoning == "step one "
    piece = stream.feed("nk>")
    assert (piece.reasoning, piece.content) == ("", "")
    assert stream.feed("\nAnswer").content == "\nAnswer"
    qwen = ReasoningPlan("qwen3", False).stream()
    piece = qwen.feed("<th")
    assert (piece.reasoning, piece.content) == ("", "")
    assert qwen.feed("ink>why").reasoning == "why"
    assert qwen.result() == ("why", None)


@pytest.mark.parametrize(
    ("option", "template", "parser"),
    [
        ("auto", "{{ '<think>\\n' if enable_thinking is false }}", "qwen3"),
        ("auto", "<\uff5cAssistant\uff5c><think>\\n", "deepseek_r1"),
        ("auto", "<|im_start|>assistant\n", None),
        ("auto", None, None),
        ("none", "<think>", None),
        ("qwen3", None, "qwen3"),
    ],
)
def test_parser_from_the_option_and_the_template(
    option: str, template: str | None, parser: str | None
) -> None:
    assert resolve_reasoning_parser(option, template) == parser


def test_prompt_decides_whether_qwen3_output_starts_in_reasoning() -> None:
    assert opened_by_prompt("qwen3", "<|im_start|>assistant\n<think>\n")
    assert not opened_by_prompt("qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not opened_by_prompt("qwen3", "<|im_start|>assistant\n")
    assert opened_by_prompt("deepseek_r1", "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def compiler(tmp_path_factory: pytest.TempPathFactory) -> tuple[Detokenizer, GrammarCompiler]:
    directory = tmp_path_factory.mktemp("reasoning-tokenizer")
    build_tiny_tokenizer(directory)
    detok = Detokenizer.from_str((directory / "tokenizer.json").read_text())
    return detok, GrammarCompiler(detok, [2])


SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
# (kind, text, an answer it takes, an answer it refuses)
ANSWERS = [
    ("json_schema", SCHEMA, '{"a": 1}', '{"b": 1}'),
    ("json_object", "", '{"x": [2]}', "[1]"),
    ("regex", "a/b+", "a/bbb", "ab"),
    ("choice", json.dumps(["yes", "no"]), "no", "maybe"),
    ("lark", 'start: "x" NUM\nNUM: /[0-9]+/', "x12", "y"),
]


@pytest.mark.parametrize(("kind", "text", "good", "bad"), ANSWERS)
def test_answer_grammar_frees_the_reasoning_and_holds_the_answer(
    compiler: tuple[Detokenizer, GrammarCompiler], kind: str, text: str, good: str, bad: str
) -> None:
    detok, grammars = compiler
    cases = [
        (True, "free {text} </thi [1]</think>\n\n", True),
        (True, "", False),  # deepseek_r1 / an open prompt: the reasoning must end first
        (False, "<think>any { thing</think>\n", True),
        (False, "", True),  # qwen3 with thinking off: the answer at once
    ]
    for opened, reasoning, takes_bare in cases:
        grammar = grammars.compile(
            "lark", ReasoningPlan("qwen3", opened).answer_grammar(kind, text), "f"
        )
        good_ids = detok.encode(reasoning + good, False)
        assert grammar.check_tokens(good_ids) == (len(good_ids), takes_bare), (opened, reasoning)
        bad_ids = detok.encode(reasoning + bad, False)
        assert grammar.check_tokens(bad_ids) != (len(bad_ids), True), (opened, reasoning)


# A Qwen3-style template: it reads enable_thinking and closes an empty think block when off.
QWEN3_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


class Script:
    """The model's output forced: each request yields ``pieces`` one step each, and the
    rendered prompt of the last request is kept."""

    def __init__(self, server: Server) -> None:
        self.pieces: list[str] = []
        self.prompts: list[str] = []
        self.grammars: list[Any] = []
        self._server = server

    async def generate(self, request: Any, client_id: str | None = None) -> AsyncIterator[Any]:
        tokenizer = self._server.tokenizer
        prompt_ids = [int(i) for i in request.prompt_token_ids]
        self.prompts.append(tokenizer.decode(prompt_ids, False))
        self.grammars.append(request.grammar)
        seq = SequenceState(0)
        for i, piece in enumerate(self.pieces):
            ids = tokenizer.encode(piece, False)
            seq.token_ids.extend(ids)
            seq.text_pieces.append(piece)
            last = i == len(self.pieces) - 1
            if last:
                seq.finish_reason = "stop"
            output = CompletionOutput(seq, len(ids), piece)
            yield RequestOutput(request.request_id, None, prompt_ids, [output], last)


@pytest.fixture(scope="module")
def thinking(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Script]]:
    model_dir: Path = build_tiny_model("llama3", tmp_path_factory.mktemp("thinking-model"))
    (model_dir / "chat_template.jinja").write_text(QWEN3_TEMPLATE)
    # Room for the tool prompt (the tiny tokenizer spends about a token per character); the
    # model never runs: its outputs are scripted.
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    server = Server(model_dir, max_model_len=2048, max_input_tokens=1500)
    script = Script(server)
    server.engine.generate = script.generate  # type: ignore[method-assign]
    yield server, script
    server.close()


def _openai(server: Server, app: App | None = None) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app or server.app))
    return openai.AsyncOpenAI(
        base_url="http://t/v1", api_key="unused", max_retries=0, http_client=http
    )


CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
MESSAGES: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
THOUGHT = ["<thi", "nk>\nThe user asks", " about Paris.</th", "ink>\n\nSunny", " today."]


def test_openai_sdk_reads_reasoning_whole_and_streamed(thinking: tuple[Server, Script]) -> None:
    server, script = thinking
    script.pieces = THOUGHT

    async def go() -> tuple[Any, list[Any]]:
        async with _openai(server) as client:
            whole = await client.chat.completions.create(model=MODEL, messages=MESSAGES)
            stream = await client.chat.completions.create(
                model=MODEL, messages=MESSAGES, stream=True
            )
            return whole, [chunk async for chunk in stream]

    whole, chunks = server.run(go())
    message = whole.choices[0].message
    assert message.reasoning_content == "\nThe user asks about Paris."
    assert message.content == "\n\nSunny today."
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert (reasoning, content) == (message.reasoning_content, message.content)
    assert not any("think>" in (d.content or "") for d in deltas)
    assert deltas[0].content is None and deltas[0].reasoning_content == "\nThe user asks"


def test_tool_calls_are_read_after_the_reasoning(thinking: tuple[Server, Script]) -> None:
    server, script = thinking
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    # The reasoning mentions a call: only the one after </think> is made.
    script.pieces = ["<think>maybe <tool_call> here?", "</think>\n\n", call[:20], call[20:]]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}}]
    body = {"model": MODEL, "messages": MESSAGES, "tools": tools}
    config = ServerConfig(served_model_name=MODEL, tool_call_parser="hermes")
    app = App(ctx=ServerContext.build(server.engine, config))

    response = server.post(ROUTE_PATHS["chat"], body, app=app)
    assert response.status_code == 200, response.text
    whole = response.json()["choices"][0]
    assert whole["message"]["reasoning_content"] == "maybe <tool_call> here?"
    assert whole["finish_reason"] == "tool_calls"
    (made,) = whole["message"]["tool_calls"]
    assert made["function"]["name"] == "get_weather"
    assert json.loads(made["function"]["arguments"]) == {"city": "Paris"}
    stream = server.post(ROUTE_PATHS["chat"], {**body, "stream": True}, app=app)
    deltas = [e["choices"][0]["delta"] for e in sse_json(stream, done=True) if e["choices"]]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    pieces = [c for d in deltas for c in d.get("tool_calls", [])]
    assert reasoning == whole["message"]["reasoning_content"]
    assert [c["function"].get("name") for c in pieces if "id" in c] == ["get_weather"]
    arguments = "".join(c["function"]["arguments"] for c in pieces)
    assert json.loads(arguments) == {"city": "Paris"}


def test_chat_template_kwargs_reach_the_template(thinking: tuple[Server, Script]) -> None:
    server, script = thinking
    script.pieces = ["No thinking: ", "</think> stays content."]
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    message = server.post(ROUTE_PATHS["chat"], body).json()["choices"][0]["message"]
    assert script.prompts[-1].endswith("<think>\n\n</think>\n\n")
    assert message == {
        "role": "assistant",
        "content": "No thinking: </think> stays content.",
        "tool_calls": None,
        "reasoning_content": None,
    }
    bad = server.post(ROUTE_PATHS["chat"], {**body, "chat_template_kwargs": {"messages": []}})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "chat_template_kwargs.messages"
    wrong = server.post(ROUTE_PATHS["chat"], {**body, "chat_template_kwargs": [1]})
    assert wrong.status_code == 400 and "chat_template_kwargs" in wrong.text


def test_databricks_keeps_the_reasoning_in_its_text(thinking: tuple[Server, Script]) -> None:
    server, script = thinking
    script.pieces = THOUGHT
    body = {"messages": MESSAGES}
    message = server.post(ROUTE_PATHS["databricks"], body).json()["choices"][0]["message"]
    assert message["content"] == "".join(THOUGHT)
    assert "reasoning_content" not in message


def test_no_split_when_the_server_says_none(thinking: tuple[Server, Script]) -> None:
    server, script = thinking
    script.pieces = THOUGHT
    config = ServerConfig(served_model_name=MODEL, reasoning_parser="none")
    app = App(ctx=ServerContext.build(server.engine, config))

    async def go() -> Any:
        async with _openai(server, app) as client:
            return await client.chat.completions.create(model=MODEL, messages=MESSAGES)

    message = server.run(go()).choices[0].message
    assert message.content == "".join(THOUGHT)
    assert getattr(message, "reasoning_content", None) is None


def test_structured_output_holds_the_answer_after_the_reasoning(
    thinking: tuple[Server, Script],
) -> None:
    server, script = thinking
    script.pieces = ["<think>free</think>\n", '{"a": 1}']
    body = {"model": MODEL, "messages": MESSAGES, "response_format": {"type": "json_object"}}
    response = server.post(ROUTE_PATHS["chat"], body)
    assert response.status_code == 200, response.text
    grammar = script.grammars[-1]
    encode = server.tokenizer.encode
    for text, takes in [
        ('<think>any {[ text</think>\n\n{"a": 1}', True),
        ('{"a": 1}', True),  # thinking off: the answer at once
        ("<think>any</think>\nnot JSON", False),
        ("not JSON", False),
    ]:
        ids = encode(text, False)
        assert (grammar.check_tokens(ids) == (len(ids), True)) is takes, text


def test_an_unknown_parser_is_refused_naming_the_option() -> None:
    with pytest.raises(EngineConfigError) as info:
        ServerConfig(reasoning_parser="qwen")
    assert info.value.field == "reasoning_parser"
