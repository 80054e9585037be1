"""Chat templates render exactly as transformers renders them, inside a sandbox."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import transformers  # the oracle; pinned in requirements/dev.txt, so never skipped

from ferrollm.executor.loader import load_model_source
from ferrollm.tokenizer import ChatTemplate, ChatTemplateError, Tokenizer

# Exercises what real templates use: bos_token, namespace, loop controls, tools | tojson with
# options, strftime_now, content given as parts, raise_exception and the generation tag.
RICH_TEMPLATE = """{{ bos_token }}
{%- set ns = namespace(system='You are helpful.') %}
{%- if messages[0]['role'] == 'system' %}{% set ns.system = messages[0]['content'] %}{% endif %}
<<SYS>>{{ ns.system }} (year {{ strftime_now('%Y') }})<</SYS>>
{% if tools %}Tools:
{% for tool in tools %}{{ tool | tojson(indent=2) }}
{% endfor %}{% endif %}
{%- for message in messages %}
{%- if message['role'] == 'system' %}{% continue %}{% endif %}
{%- if message['role'] not in ['user', 'assistant', 'tool'] %}
{{- raise_exception('Unknown role: ' + message['role']) }}
{%- endif %}
{%- if message['content'] is string %}{% set text = message['content'] %}
{%- else %}{% set text = message['content'] | map(attribute='text') | join(' ') %}{% endif %}
[{{ message['role'] | upper }}] {% if message['role'] == 'assistant' %}{% generation %}
{{- text }}{% endgeneration %}{{ eos_token }}{% else %}{{ text }}{% endif %}
{% if loop.last and add_generation_prompt %}[ASSISTANT] {% endif %}
{%- endfor %}"""

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city — ünïcode kept as is",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Two"}, {"type": "text", "text": "parts"}],
        },
    ],
]


@pytest.fixture(scope="module")
def tiny_dir(tiny_model_factory: Callable[..., Path]) -> Path:
    return tiny_model_factory("tied")


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> Tokenizer:
    return Tokenizer.from_source(load_model_source(tiny_dir))


def hf_render(hf_tokenizer: Any, template: str | None, messages: Any, **kwargs: Any) -> str:
    text: str = hf_tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=False, **kwargs
    )
    return text


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("tools", [None, [WEATHER_TOOL]])
def test_rich_template_renders_like_transformers(
    hf_tokenizer: Any,
    tokenizer: Tokenizer,
    conversation: list[dict[str, Any]],
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None,
) -> None:
    expected = hf_render(
        hf_tokenizer,
        RICH_TEMPLATE,
        conversation,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
    )
    template = ChatTemplate(RICH_TEMPLATE, {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"})
    assert template.render(conversation, tools, add_generation_prompt) == expected
    assert "ünïcode" in expected if tools else "Tools" not in expected


@pytest.mark.parametrize("conversation", CONVERSATIONS[:1])
def test_model_template_and_token_ids_match_transformers(
    hf_tokenizer: Any, tokenizer: Tokenizer, conversation: list[dict[str, Any]]
) -> None:
    text = tokenizer.apply_chat_template(conversation)
    assert text == hf_render(hf_tokenizer, None, conversation, add_generation_prompt=True)
    expected_ids = hf_tokenizer.apply_chat_template(
        conversation, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert tokenizer.encode_chat(conversation) == list(expected_ids)
    assert tokenizer.encode("Hello world") == hf_tokenizer("Hello world")["input_ids"]


def test_smollm2_template_matches_transformers(smollm2_gguf: Path) -> None:
    source = load_model_source(smollm2_gguf)
    tokenizer = Tokenizer.from_source(source)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=_tokenizers_from(source))
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    expected = hf_render(hf, source.chat_template, messages, add_generation_prompt=True)
    assert tokenizer.apply_chat_template(messages) == expected
    assert expected.endswith("<|im_start|>assistant\n")


def _tokenizers_from(source: Any) -> Any:
    from tokenizers import Tokenizer as HFTokenizer

    return HFTokenizer.from_str(source.tokenizer_json)


def test_raise_exception_becomes_a_value_error_with_the_template_message() -> None:
    template = ChatTemplate(RICH_TEMPLATE)
    with pytest.raises(ChatTemplateError, match="Unknown role: robot") as info:
        template.render([{"role": "robot", "content": "beep"}])
    assert isinstance(info.value, ValueError)


def test_syntax_errors_surface_when_the_template_is_loaded() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}{{ m['content'] }}")


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.__class__.__mro__ }}",
        "{{ ''.__class__.__base__.__subclasses__() }}",
        "{% set _ = messages.append({'role': 'x'}) %}",
        "{% set ns = namespace() %}{% set ns._hidden = 1 %}",
        "{{ raise_exception.__globals__ }}",
    ],
)
def test_the_sandbox_blocks_python_internals_and_mutation(source: str) -> None:
    # An unsafe attribute reads as undefined: it renders as nothing, and using it raises.
    try:
        rendered = ChatTemplate(source).render([{"role": "user", "content": "x"}])
    except ChatTemplateError:
        return
    assert rendered == ""


def test_messages_are_copied_as_plain_data() -> None:
    class Sneaky(str):
        def shout(self) -> str:
            return "escaped"

    messages = [{"role": "user", "content": Sneaky("hi")}]
    template = ChatTemplate("{{ messages[0]['content'].shout() }}")
    with pytest.raises(ChatTemplateError):
        template.render(messages)
    assert ChatTemplate("{{ messages[0]['content'] }}").render(messages) == "hi"


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ("hello", "list of messages"),
        (["hello"], r"`messages\[0\]` must be an object"),
        ([{"content": "no role"}], r"`messages\[0\].role`"),
    ],
)
def test_malformed_messages_name_the_field(messages: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ChatTemplate("x").render(messages)


def test_a_model_without_a_template_says_so() -> None:
    tokenizer = Tokenizer(_tiny_detokenizer(), chat_template=None)
    with pytest.raises(ChatTemplateError, match="no chat template"):
        tokenizer.apply_chat_template([{"role": "user", "content": "x"}])


def _tiny_detokenizer() -> Any:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    from ferrollm import Detokenizer

    return Detokenizer.from_str(HFTokenizer(models.BPE()).to_str())


_RUNAWAY = {
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}"
    "{% endfor %}{% endfor %}",
    "a loop of lookups": "{% for i in range(100000) %}{% for j in range(100000) %}"
    "{{ messages[0].role[:0] }}{% endfor %}{% endfor %}",
}
_HUGE = {
    "repetition": "{{ 'x' * 1000000000 }}",
    "doubling through a namespace": "{% set ns = namespace(s='xx') %}"
    "{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "output": "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}",
    "a padded string": "{{ 'x'.ljust(10000000000) }}",
    "a huge power": "{{ 2 ** 1000000000 }}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
}


@pytest.mark.parametrize("source", list(_RUNAWAY.values()), ids=list(_RUNAWAY))
def test_a_template_that_loops_is_stopped_at_the_time_bound(
    source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ferrollm.tokenizer.MAX_RENDER_SECONDS", 0.3)
    started = time.monotonic()
    with pytest.raises(ChatTemplateError, match=r"longer than 0\.3 s"):
        ChatTemplate(source).render([{"role": "user", "content": "Hi"}])
    assert time.monotonic() - started < 3.0
    # the bound belongs to one render: the next one has its own
    assert (
        ChatTemplate("{{ messages[0].content }}").render([{"role": "u", "content": "ok"}]) == "ok"
    )


@pytest.mark.parametrize("source", list(_HUGE.values()), ids=list(_HUGE))
def test_a_template_that_builds_an_enormous_string_is_stopped_before_it_allocates(
    source: str,
) -> None:
    started = time.monotonic()
    with pytest.raises(ChatTemplateError, match=r"MAX_RENDER_CHARS|exponent|recursed"):
        ChatTemplate(source).render([{"role": "user", "content": "Hi"}])
    assert time.monotonic() - started < 3.0


def test_bounded_range_still_behaves_like_range() -> None:
    source = (
        "{% for i in range(4)|reverse %}{{ i }}{% endfor %}|{{ range(2, 9, 3)|list }}|"
        "{{ range(5)|length }}|{% for i in range(3) %}{{ loop.last }}{% endfor %}"
    )
    out = ChatTemplate(source).render([{"role": "user", "content": "Hi"}])
    assert out == "3210|[2, 5, 8]|5|FalseFalseTrue"
