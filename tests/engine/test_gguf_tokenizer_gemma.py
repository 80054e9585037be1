"""Gemma 3 270M's GGUF tokenizer (SentencePiece, 262,144 pieces, no merges, no space prefix)
against transformers' tokenizer of the same file, through ferrollm's Rust `Detokenizer`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ferrollm._core import Detokenizer
from ferrollm.executor.chat_templates import GEMMA_CHAT_TEMPLATE
from ferrollm.executor.gguf_reader import GGUFFile
from ferrollm.executor.gguf_tokenizer import build_tokenizer_json
from ferrollm.tokenizer import Tokenizer

BOS, START_OF_TURN, END_OF_TURN = 2, 105, 106
GEMMA_TEXTS = [
    "Hello world",
    "The capital of France is",
    " one leading space",
    "   three leading spaces, and two  inside   here    ",
    "\nnewlines\n\nand\n\n\n\ttabs\t\tmixed \n  in",
    "naïve café résumé Ünïcödé",
    "你好\uff0c世界。日本語のテキスト",  # full-width comma
    "emoji 😀👍🏽 and flags 🇫🇷",
    "def f(x):\n    return x ** 2  # 3.14159, 2024-01-01, 1234567",
    "I'm sure they'll say WE'VE won",
    "a literal ▁ marker and <b>html</b> and [multimodal]",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!"
    "<end_of_turn>\n<start_of_turn>user\nAnd you?<end_of_turn>\n<start_of_turn>model\n",
]


@pytest.fixture(scope="module")
def gemma_meta(gemma3_270m_gguf: Path) -> dict[str, Any]:
    return GGUFFile(gemma3_270m_gguf).metadata


@pytest.fixture(scope="module")
def ours(gemma_meta: dict[str, Any]) -> Tokenizer:
    return Tokenizer(Detokenizer.from_str(build_tokenizer_json(gemma_meta)))


@pytest.fixture(scope="module")
def hf(gemma3_270m_gguf: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gemma3_270m_gguf.parent, gguf_file=gemma3_270m_gguf.name)


def test_the_file_asks_for_bos_and_no_space_prefix(gemma_meta: dict[str, Any]) -> None:
    # What the tests below rely on: the file's own flags, and no chat template in it.
    assert gemma_meta["tokenizer.ggml.model"] == "llama"
    assert gemma_meta["tokenizer.ggml.add_bos_token"] is True
    assert gemma_meta["tokenizer.ggml.add_space_prefix"] is False
    assert "tokenizer.ggml.merges" not in gemma_meta
    assert "tokenizer.chat_template" not in gemma_meta


def test_a_plain_prompt_gets_bos_and_no_space_marker(ours: Tokenizer) -> None:
    # The first word is "Hello" (9259), not "▁Hello" (26352): the file says add no prefix.
    assert ours.encode("Hello world") == [BOS, 9259, 1902]
    assert ours.encode("Hello world", add_special_tokens=False) == [9259, 1902]
    assert ours.encode(" Hello")[:2] == [BOS, 26352]  # a space the user wrote is kept


@pytest.mark.parametrize("text", GEMMA_TEXTS)
def test_ids_equal_transformers(ours: Tokenizer, hf: Any, text: str) -> None:
    ids = ours.encode(text)
    assert ids == hf(text)["input_ids"]
    assert (
        ours.encode(text, add_special_tokens=False)
        == hf(text, add_special_tokens=False)["input_ids"]
    )
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    # transformers keeps special tokens with nothing between them and the text
    kept = ours.detokenizer.decode(
        ids, skip_special_tokens=False, spaces_between_special_tokens=False
    )
    assert kept == hf.decode(ids)


@pytest.mark.parametrize("text", [t for t in GEMMA_TEXTS if "<" not in t])
def test_decode_round_trips(ours: Tokenizer, text: str) -> None:
    assert ours.decode(ours.encode(text)) == text


def test_chat_markers_are_single_tokens(ours: Tokenizer) -> None:
    ids = ours.encode("<start_of_turn>user\nHi<end_of_turn>\n", add_special_tokens=False)
    assert ids[0] == START_OF_TURN and ids[-2] == END_OF_TURN
    assert ours.decode(ids) == "user\nHi\n"  # control tokens are special: skipped


def test_builtin_template_encodes_with_one_bos(ours: Tokenizer, hf: Any) -> None:
    from ferrollm.tokenizer import ChatTemplate

    template = ChatTemplate(GEMMA_CHAT_TEMPLATE, {"bos_token": "<bos>", "eos_token": "<eos>"})
    text = template.render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    ids = ours.encode(text, add_special_tokens=False)
    assert ids == hf(text, add_special_tokens=False)["input_ids"]
    assert ids[:2] == [BOS, START_OF_TURN] and ids.count(BOS) == 1
