"""The grammars that hold tool calls to ``tool_choice``, per family, over the default model's
tokenizer: ``required`` takes one or more well-formed calls and nothing else, a named choice
exactly one call of that function, ``auto`` free text or calls (and never a malformed call
after the marker); arguments must follow the function's schema; a schema built to explode is
refused quickly."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ferrollm._core import GrammarCompiler, ValidationError
from ferrollm.executor.loader import load_model_source
from ferrollm.tokenizer import Tokenizer
from ferrollm.tools import FORMATS, Function

WEATHER = Function(
    "get_weather",
    None,
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "maximum": 7}},
        "required": ["city", "days"],
    },
)
TIME = Function("get_time", None, None)
FUNCTIONS = [WEATHER, TIME]

W = '{"name": "get_weather", "%s": {"city": "Paris", "days": 2}}'
T = '{"name": "get_time", "%s": {}}'
BAD_ARGS = '{"name": "get_weather", "%s": {"city": "Paris", "days": 9}}'
EXTRA_KEY = '{"name": "get_weather", "%s": {"city": "Paris", "days": 2, "x": 1}}'

# family -> (one weather call, two calls, free text, a call with arguments off the schema,
#            one with an undeclared key)
TEXTS = {
    "hermes": (
        f"<tool_call>\n{W % 'arguments'}\n</tool_call>",
        f"<tool_call>\n{W % 'arguments'}\n</tool_call>\n"
        f"<tool_call>\n{T % 'arguments'}\n</tool_call>",
        "It is sunny.",
        f"<tool_call>\n{BAD_ARGS % 'arguments'}\n</tool_call>",
        f"<tool_call>\n{EXTRA_KEY % 'arguments'}\n</tool_call>",
    ),
    "llama3_json": (
        W % "parameters",
        f"{W % 'parameters'}; {T % 'parameters'}",
        "It is sunny.",
        BAD_ARGS % "parameters",
        EXTRA_KEY % "parameters",
    ),
    "mistral": (
        f"[TOOL_CALLS][{W % 'arguments'}]",
        f"[TOOL_CALLS][{W % 'arguments'}, {T % 'arguments'}]",
        "It is sunny.",
        f"[TOOL_CALLS][{BAD_ARGS % 'arguments'}]",
        f"[TOOL_CALLS][{EXTRA_KEY % 'arguments'}]",
    ),
    "chatglm3": (
        'get_weather\n```python\ntool_call(city="Paris", days=2)\n```',
        None,  # one call per message in this family
        "\nIt is sunny.",
        'get_weather\n```python\ntool_call(city="Paris", days=9)\n```',
        'get_weather\n```python\ntool_call(city="Paris", days=2, x=1)\n```',
    ),
}


@pytest.fixture(scope="module")
def compiler_and_tokenizer(smollm2_gguf: Path) -> tuple[GrammarCompiler, Tokenizer]:
    source = load_model_source(smollm2_gguf)
    tokenizer = Tokenizer.from_source(source)
    eos = source.special_tokens.eos_token_id
    assert eos is not None
    return GrammarCompiler(tokenizer.detokenizer, [eos]), tokenizer


def accepts(
    compiler_and_tokenizer: tuple[GrammarCompiler, Tokenizer], grammar: str, text: str
) -> bool:
    compiler, tokenizer = compiler_and_tokenizer
    compiled = compiler.compile("lark", grammar, "tools")
    ids = tokenizer.encode(text, add_special_tokens=False)
    taken, accepting = compiled.check_tokens(ids)
    return taken == len(ids) and accepting


@pytest.mark.parametrize("family", list(FORMATS))
def test_required_takes_only_well_formed_calls(
    family: str, compiler_and_tokenizer: tuple[GrammarCompiler, Tokenizer]
) -> None:
    one, two, free, bad_args, extra = TEXTS[family]
    grammar = FORMATS[family](FUNCTIONS).grammar(FUNCTIONS, free_text=False, single=False)
    assert accepts(compiler_and_tokenizer, grammar, one)
    if two is not None:
        assert accepts(compiler_and_tokenizer, grammar, two)
    for text in (free, bad_args, extra, ""):
        assert not accepts(compiler_and_tokenizer, grammar, text), text


@pytest.mark.parametrize("family", list(FORMATS))
def test_named_choice_takes_one_call_of_that_function(
    family: str, compiler_and_tokenizer: tuple[GrammarCompiler, Tokenizer]
) -> None:
    one, two, free, _, _ = TEXTS[family]
    fmt = FORMATS[family](FUNCTIONS)
    weather = fmt.grammar([WEATHER], free_text=False, single=True)
    assert accepts(compiler_and_tokenizer, weather, one)
    for text in (two, free):
        if text is not None:
            assert not accepts(compiler_and_tokenizer, weather, text), text
    time_only = fmt.grammar([TIME], free_text=False, single=True)
    assert not accepts(compiler_and_tokenizer, time_only, one)


@pytest.mark.parametrize("family", list(FORMATS))
def test_auto_takes_free_text_or_calls_but_no_malformed_call(
    family: str, compiler_and_tokenizer: tuple[GrammarCompiler, Tokenizer]
) -> None:
    one, two, free, bad_args, extra = TEXTS[family]
    grammar = FORMATS[family](FUNCTIONS).grammar(FUNCTIONS, free_text=True, single=False)
    for text in (one, two, free):
        if text is not None:
            assert accepts(compiler_and_tokenizer, grammar, text), text
    for text in (bad_args, extra):
        assert not accepts(compiler_and_tokenizer, grammar, text), text


def test_hermes_auto_allows_text_before_the_call(
    compiler_and_tokenizer: tuple[GrammarCompiler, Tokenizer],
) -> None:
    grammar = FORMATS["hermes"](FUNCTIONS).grammar(FUNCTIONS, free_text=True, single=False)
    one = TEXTS["hermes"][0]
    assert accepts(compiler_and_tokenizer, grammar, f"Let me look that up. {one}")
    assert not accepts(compiler_and_tokenizer, grammar, "Text <tool_call>\nnot json")


def test_an_exploding_parameter_schema_is_refused_quickly(
    compiler_and_tokenizer: tuple[GrammarCompiler, Tokenizer],
) -> None:
    compiler, _ = compiler_and_tokenizer
    hostile = Function(
        "f",
        None,
        {
            "type": "object",
            "properties": {"x": {"type": "string", "pattern": "((a{100}){100}){100}"}},
        },
    )
    grammar = FORMATS["hermes"]([hostile]).grammar([hostile], free_text=False, single=False)
    start = time.monotonic()
    with pytest.raises(ValidationError) as info:
        compiler.compile("lark", grammar, "tools")
    assert time.monotonic() - start < 5.0
    assert info.value.param == "tools"
