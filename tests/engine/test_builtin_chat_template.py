"""Built-in chat templates for GGUF files without one: picked by ``general.architecture``, and
rendering what the family's official template renders (expected strings written from Gemma's
documented format: ``<bos>``, then ``<start_of_turn>{user|model}\\n{text}<end_of_turn>\\n``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from ferrollm.executor import loader_gguf
from ferrollm.executor.chat_templates import GEMMA_CHAT_TEMPLATE, builtin_chat_template
from ferrollm.executor.gguf_reader import GGUFFile
from ferrollm.executor.loader import load_model_source
from ferrollm.tokenizer import ChatTemplate, ChatTemplateError, Tokenizer

GEMMA_SPECIAL_TOKENS = {"bos_token": "<bos>", "eos_token": "<eos>"}

GEMMA_CHATS: list[tuple[list[dict[str, Any]], bool, str]] = [
    (
        [{"role": "user", "content": "What is the capital of France?"}],
        True,
        "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n"
        "<start_of_turn>model\n",
    ),
    (  # the system message opens the first user turn; each turn's text is trimmed
        [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "  Capital of Italy?\n"},
        ],
        True,
        "<bos><start_of_turn>user\nAnswer in one word.\n\nCapital of Italy?<end_of_turn>\n"
        "<start_of_turn>model\n",
    ),
    (  # assistant turns are "model" turns; no generation prompt when not asked for
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! "},
            {"role": "user", "content": "Bye"},
        ],
        False,
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n",
    ),
    (  # content as text parts: each trimmed, joined with nothing between
        [
            {"role": "system", "content": [{"type": "text", "text": "Be kind."}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": "One "}, {"type": "text", "text": " two"}],
            },
        ],
        True,
        "<bos><start_of_turn>user\nBe kind.\n\nOnetwo<end_of_turn>\n<start_of_turn>model\n",
    ),
]


@pytest.fixture(scope="module")
def gemma_template() -> ChatTemplate:
    return ChatTemplate(GEMMA_CHAT_TEMPLATE, GEMMA_SPECIAL_TOKENS)


@pytest.mark.parametrize(("messages", "add_generation_prompt", "expected"), GEMMA_CHATS)
def test_gemma_template_renders_gemmas_turns(
    gemma_template: ChatTemplate,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    expected: str,
) -> None:
    assert gemma_template.render(messages, add_generation_prompt=add_generation_prompt) == expected


@pytest.mark.parametrize(
    "roles",
    [["assistant"], ["user", "user"], ["system", "assistant"], ["user", "assistant", "assistant"]],
)
def test_gemma_template_refuses_turns_that_do_not_alternate(
    gemma_template: ChatTemplate, roles: list[str]
) -> None:
    messages = [{"role": role, "content": "x"} for role in roles]
    with pytest.raises(ChatTemplateError, match="alternate user and assistant"):
        gemma_template.render(messages)


def test_gemma_template_refuses_content_that_is_not_text(gemma_template: ChatTemplate) -> None:
    with pytest.raises(ChatTemplateError, match="text content"):
        gemma_template.render([{"role": "user", "content": None}])


@pytest.mark.parametrize("architecture", ["gemma", "gemma2", "gemma3"])
def test_gemma_files_get_the_gemma_template_and_say_so(
    architecture: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="ferrollm.executor.chat_templates"):
        assert builtin_chat_template({"general.architecture": architecture}) == (
            GEMMA_CHAT_TEMPLATE
        )
    assert caplog.messages == ["no chat template in the file; using the built-in gemma template"]


def test_other_families_get_no_builtin_template(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ferrollm.executor.chat_templates"):
        assert builtin_chat_template({"general.architecture": "llama"}) is None
        assert builtin_chat_template({}) is None
    assert caplog.messages == []


def test_a_files_own_template_wins(smollm2_gguf: Path) -> None:
    source = load_model_source(smollm2_gguf)
    assert source.chat_template is not None
    assert source.chat_template == GGUFFile(smollm2_gguf).metadata["tokenizer.chat_template"]


def test_the_gemma_file_opens_with_the_gemma_template(gemma3_270m_gguf: Path) -> None:
    source = loader_gguf.GGUFCheckpoint.open(gemma3_270m_gguf)
    assert source.chat_template == GEMMA_CHAT_TEMPLATE
    # Turns end at <end_of_turn> as well as <eos>, as transformers' generation config says.
    assert source.config.eos_token_ids == (1, 106)
    tokenizer = Tokenizer.from_source(source)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(messages) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    )
    ids = tokenizer.encode_chat(messages)
    start_of_turn, end_of_turn, newline = 105, 106, 107
    assert ids[:2] == [2, start_of_turn] and ids.count(2) == 1  # BOS once, from the template
    assert ids.count(start_of_turn) == 2 and ids.count(end_of_turn) == 1
    assert ids[-3] == start_of_turn and ids[-1] == newline  # "<start_of_turn>model\n"
