"""The detokenizer from Python: tokenizers built with the `tokenizers` package, saved as
tokenizer.json, loaded by `ferrollm.Detokenizer`, and streamed token by token."""

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from ferrollm import DecodeStream, Detokenizer, ValidationError

CORPUS = """The quick brown fox jumps over the lazy dog. It wasn't the dog's fault.
Streaming detokenization must never cut a character in half; hold bytes back.
fn main() { let v: Vec<u32> = (0..10).map(|x| x * 2).collect(); }
def decode(ids: list[int]) -> str: return "".join(vocab[i] for i in ids)
我们的推理服务器使用连续批处理和分页注意力，以提高吞吐量并降低延迟。
人工智能正在改变世界，大语言模型可以写代码、翻译文章、回答问题。
日本語のテキストも含まれています。ひらがな、カタカナ、そして漢字。
한국어 문장도 있습니다. 안녕하세요, 만나서 반갑습니다.
Café, naïve, façade, jalapeño, Straße, crème brûlée, cafe\u0301, re\u0301sume\u0301.
Русский текст: Привет, как дела? Ελληνικά: Καλημέρα κόσμε. العربية: مرحبا
Emoji: 😀 🎉 🚀 ❤️ 👍🏽 👩🏽‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷 🦀 ✨
    indented\tcode with  double  spaces and numbers 0 1 2 3.5 -7 1e-5 0xFF
"""  # noqa: RUF001 (the full-width commas are the point)
BYTE_LEVEL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SENTENCEPIECE_SPECIALS = ["<unk>", "<s>", "</s>"]
WORDPIECE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
KINDS = ["byte_level", "sentencepiece", "wordpiece"]
FLAGS = [(True, True), (True, False), (False, True), (False, False)]


def _byte_level() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=BYTE_LEVEL_SPECIALS,
    )
    tok.train_from_iterator(CORPUS.splitlines(), trainer)
    tok.add_tokens(["<think>"])
    return tok


def _sentencepiece() -> Tokenizer:
    """Llama-2 style: specials at 0..3, <0x00>..<0xFF> at 3..259, byte fallback."""
    normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    base = Tokenizer(models.BPE())
    base.normalizer = normalizer
    base.pre_tokenizer = pre_tokenizer
    base.train_from_iterator(
        CORPUS.splitlines(),
        trainers.BpeTrainer(vocab_size=700, show_progress=False, limit_alphabet=110),
    )
    trained = json.loads(base.to_str())["model"]
    merges: list[tuple[str, str]] = []
    for merge in trained["merges"]:  # "a b" in older tokenizer.json files, ["a", "b"] now
        first, second = merge.split(" ") if isinstance(merge, str) else merge
        merges.append((first, second))
    vocab = {name: i for i, name in enumerate(SENTENCEPIECE_SPECIALS)}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for token, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(token, len(vocab))
    model = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True)
    tok = Tokenizer(model)
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.add_special_tokens(SENTENCEPIECE_SPECIALS)
    return tok


def _wordpiece() -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=700, show_progress=False, special_tokens=WORDPIECE_SPECIALS
    )
    tok.train_from_iterator(CORPUS.splitlines(), trainer)
    return tok


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Tokenizer, Detokenizer]]:
    """Each kind as (the `tokenizers` reference, ferrollm's Detokenizer loaded from disk)."""
    root = tmp_path_factory.mktemp("tokenizers")
    built = {
        "byte_level": _byte_level(),
        "sentencepiece": _sentencepiece(),
        "wordpiece": _wordpiece(),
    }
    loaded = {}
    for kind, tok in built.items():
        path = root / f"{kind}.json"
        tok.save(str(path))
        loaded[kind] = (tok, Detokenizer.from_file(path))
    return loaded


def _stream(det: Detokenizer, ids: list[int], skip: bool, spaces: bool) -> list[str]:
    stream = det.stream(skip, spaces)
    return [stream.step(i) for i in ids] + [stream.finish()]


def _id(tok: Tokenizer, token: str) -> int:
    token_id = tok.token_to_id(token)
    assert token_id is not None, token
    return token_id


def _specials(tok: Tokenizer) -> list[int]:
    return sorted(i for i, t in tok.get_added_tokens_decoder().items() if t.special)


def _is_byte_token(tok: Tokenizer, token_id: int) -> bool:
    token = tok.id_to_token(token_id) or ""
    return len(token) == 6 and token.startswith("<0x") and token.endswith(">")


PIECES = [
    "中文",
    "龘",
    "齉",
    "🦀",
    "👩🏽‍💻",
    "👨‍👩‍👧‍👦",
    "🇫🇷",
    "e\u0301",
    "naïve",
    " ",
    "\n",
    "\t",
    "the",
    " model",
]
TEXT = st.lists(
    st.one_of(
        st.sampled_from(PIECES),
        st.text(st.characters(codec="utf-8", exclude_characters="\ufffd"), max_size=4),
    ),
    max_size=16,
).map("".join)
INSERTS = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), max_size=4)


def _with_specials(tok: Tokenizer, ids: list[int], inserts: list[tuple[int, int]]) -> list[int]:
    """Inserts special tokens, never inside a byte-fallback character (that is not text)."""
    allowed = [0] + [i + 1 for i, t in enumerate(ids) if not _is_byte_token(tok, t)]
    specials = _specials(tok)
    placed = sorted(
        ((allowed[a % len(allowed)], specials[s % len(specials)]) for a, s in inserts), reverse=True
    )
    out = list(ids)
    for at, token_id in placed:
        out.insert(at, token_id)
    return out


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=60, deadline=None)
@given(text=TEXT, inserts=INSERTS)
def test_deltas_concatenate_to_decode(
    pairs: dict[str, tuple[Tokenizer, Detokenizer]],
    kind: str,
    text: str,
    inserts: list[tuple[int, int]],
) -> None:
    tok, det = pairs[kind]
    ids = _with_specials(tok, tok.encode(text, add_special_tokens=False).ids, inserts)
    for skip, spaces in FLAGS:
        deltas = _stream(det, ids, skip, spaces)
        assert "".join(deltas) == det.decode(ids, skip, spaces)
        if skip:
            assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True)
            assert not any("\ufffd" in d for d in deltas), deltas


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=30, deadline=None)
@given(text=TEXT, cuts=st.lists(st.integers(0, 10**6), max_size=6))
def test_push_in_chunks_equals_step(
    pairs: dict[str, tuple[Tokenizer, Detokenizer]], kind: str, text: str, cuts: list[int]
) -> None:
    tok, det = pairs[kind]
    ids = tok.encode(text, add_special_tokens=False).ids
    bounds = sorted({0, len(ids), *(c % (len(ids) + 1) for c in cuts)})
    stream = det.stream()
    dtypes = [np.int64, np.uint32, np.int32]
    parts = [
        stream.push(np.asarray(ids[a:b], dtype=dtypes[n % 3]))
        for n, (a, b) in enumerate(itertools.pairwise(bounds))
    ]
    assert "".join(parts) + stream.finish() == "".join(_stream(det, ids, True, True))
    stream = det.stream()
    assert stream.push(ids) + stream.finish() == det.decode(np.asarray(ids, dtype=np.int64))


def test_byte_fallback_cjk_and_emoji_token_by_token(
    pairs: dict[str, tuple[Tokenizer, Detokenizer]],
) -> None:
    tok, det = pairs["sentencepiece"]
    # Neither character is in the training corpus, so both must fall back to byte tokens (a
    # corpus character seen once may or may not survive `limit_alphabet`: ties are unordered).
    ids = tok.encode("龘🦑", add_special_tokens=False).ids
    assert [tok.id_to_token(i) for i in ids] == [
        "▁",
        *(f"<0x{b:02X}>" for b in "龘🦑".encode()),
    ]
    assert _stream(det, ids, True, True) == ["", "", "", "龘", "", "", "", "🦑", ""]
    # Cut inside a character: the held-back bytes come out as decode renders them.
    assert _stream(det, ids[:3], True, True) == ["", "", "", "\ufffd\ufffd"]
    assert det.decode(ids[:3]) == tok.decode(ids[:3]) == "\ufffd\ufffd"


def test_special_tokens_are_segments(pairs: dict[str, tuple[Tokenizer, Detokenizer]]) -> None:
    tok, det = pairs["sentencepiece"]
    ids = [1, *tok.encode("Hello world", add_special_tokens=False).ids, 2]
    assert det.decode(ids) == "Hello world"
    assert det.decode(ids, skip_special_tokens=False) == "<s> Hello world </s>"
    assert det.decode(ids, False, False) == "<s>Hello world</s>"
    assert "".join(_stream(det, ids, False, True)) == "<s> Hello world </s>"
    assert det.is_special(1) and not det.is_special(ids[1])


def test_tables(pairs: dict[str, tuple[Tokenizer, Detokenizer]]) -> None:
    for kind, (tok, det) in pairs.items():
        assert det.vocab_size == tok.get_vocab_size(with_added_tokens=True)
        assert det.has_fast_path == (kind == "byte_level")
        assert det.encode("hello world") == tok.encode("hello world", add_special_tokens=False).ids
    tok, det = pairs["byte_level"]
    text = "naïve 龘🦀 code"
    ids = det.encode(text)
    assert b"".join(det.token_bytes(i) for i in ids) == text.encode()
    assert det.token_text(_id(tok, "Ġthe")) == " the"
    tok, det = pairs["sentencepiece"]
    assert det.token_text(_id(tok, "▁the")) == " the"
    assert det.token_bytes(_id(tok, "<0xE4>")) == b"\xe4"
    assert det.token_text(1) == "<s>"
    assert det.token_text(det.vocab_size + 5) == ""


def test_loading(pairs: dict[str, tuple[Tokenizer, Detokenizer]], tmp_path: Path) -> None:
    tok, _ = pairs["wordpiece"]
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    for det in (Detokenizer.from_file(str(path)), Detokenizer.from_str(tok.to_str())):
        assert det.decode(det.encode("hello world")) == "hello world"
        assert isinstance(det.stream(), DecodeStream)
    with pytest.raises(ValidationError) as bad_json:
        Detokenizer.from_str("not json")
    assert bad_json.value.param == "tokenizer"
    with pytest.raises(ValidationError) as missing:
        Detokenizer.from_file(tmp_path / "missing.json")
    assert missing.value.param == "tokenizer" and "missing.json" in str(missing.value)


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda s: s.step(-1), "token_id"),
        (lambda s: s.step(2**32), "token_id"),
        (lambda s: s.step("7"), "token_id"),
        (lambda s: s.push(np.zeros((2, 2), dtype=np.int64)), "token_ids"),
        (lambda s: s.push(np.array([1.5])), "token_ids"),
        (lambda s: s.push([1, -2]), "token_ids"),
        (lambda s: s.push(["a"]), "token_ids"),
    ],
)
def test_bad_ids_name_the_field(
    pairs: dict[str, tuple[Tokenizer, Detokenizer]],
    call: Callable[[DecodeStream], object],
    param: str,
) -> None:
    _, det = pairs["byte_level"]
    with pytest.raises(ValidationError) as err:
        call(det.stream())
    assert err.value.param == param
