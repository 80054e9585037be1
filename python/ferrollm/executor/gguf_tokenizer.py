"""Rebuilding a ``tokenizer.json`` from a GGUF file's ``tokenizer.ggml.*`` metadata.

A GGUF carries no tokenizer.json, only the vocabulary, merges, token types and special ids under
llama.cpp's key names. We rebuild the same tokenizer transformers builds from those keys
(``transformers/integrations/gguf``), so the token ids agree with
``AutoTokenizer.from_pretrained(dir, gguf_file=...)``:

* ``gpt2`` (byte-level BPE): the vocabulary spelled in the byte alphabet, the file's merges, and
  the pre-tokenizer split that ``tokenizer.ggml.pre`` names (llama.cpp's table);
* ``llama`` (SentencePiece as BPE with byte fallback): merges from the file, or recovered from the
  scores when the file has none; "▁" is put before the text only when
  ``tokenizer.ggml.add_space_prefix`` asks for it (llama.cpp's default), and Gemma files get the
  two fixes transformers makes for them (`_sentencepiece_pieces`, `_merge_ranks`).

Control tokens become special added tokens, user-defined ones plain added tokens, and BOS is put
in front by the post-processor when ``tokenizer.ggml.add_bos_token`` asks for it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from ferrollm.models.config import UnsupportedModelError

logger = logging.getLogger(__name__)

_CONTROL = 3  # llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte
_USER_DEFINED = 4

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: ``tokenizer.ggml.pre`` -> the regex its merges were learned under (llama.cpp's table).
_PRE_SPLITS: Mapping[str, str] = {
    **dict.fromkeys(
        ["llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "dbrx", "smaug-bpe"],
        _LLAMA3_SPLIT,
    ),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "megrez"], _QWEN2_SPLIT),
    # GLM-4 ("chatglm-bpe" from ChatGLMModel, "glm4" from Glm4Model): Llama 3's split.
    **dict.fromkeys(["chatglm-bpe", "glm4"], _LLAMA3_SPLIT),
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(["gpt-4o", "llama4"], _GPT4O_SPLIT),
}
#: Pre types that split every digit off first, then apply GPT-2's regex (SmolLM, StarCoder...).
_DIGITS_THEN_GPT2 = frozenset(
    ["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"]
)
#: Pre types whose BOS llama.cpp drops (GLM-4 has none): no id, never put first.
_NO_BOS = frozenset(["chatglm-bpe", "glm4"])
#: Pre types that are plain GPT-2 byte-level splitting.
_GPT2 = frozenset(["gpt-2", "gpt2", "mpt", "olmo", "jais", "default"])
#: ``general.architecture`` of the Gemma files whose SentencePiece vocabulary transformers
#: rebuilds its own way (``gemma_tokenizer`` in ``transformers/integrations/gguf``).
_GEMMA_FAMILY = frozenset(["gemma", "gemma2", "gemma3"])


def build_tokenizer_json(meta: Mapping[str, Any]) -> str:
    """The ``tokenizer.json`` text for the tokenizer a GGUF's metadata describes;
    UnsupportedModelError for a tokenizer it does not support or metadata that is malformed
    (a missing or mistyped key, an id out of range)."""
    try:
        return _tokenizer_json(meta)
    except UnsupportedModelError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise UnsupportedModelError(
            f"the GGUF tokenizer metadata is malformed ({type(e).__name__}: {str(e)[:200]})"
        ) from None
    except Exception as e:  # the tokenizers library's own errors (a bad vocabulary, merges)
        if type(e).__name__ != "Exception":
            raise
        raise UnsupportedModelError(
            f"the GGUF tokenizer metadata does not make a tokenizer: {str(e)[:200]}"
        ) from None


def _tokenizer_json(meta: Mapping[str, Any]) -> str:
    kind = meta.get("tokenizer.ggml.model")
    if kind == "gpt2":
        tokenizer = _byte_level_bpe(meta)
    elif kind == "llama":
        tokenizer = _sentencepiece_bpe(meta)
    else:
        raise UnsupportedModelError(
            f"GGUF tokenizer model {kind!r} is not supported; supported: gpt2, llama"
        )
    _add_special_tokens(tokenizer, meta, byte_level=kind == "gpt2")
    bos, bos_id = special_token(meta, "bos_token_id"), special_token_id(meta, "bos_token_id")
    if add_bos_token(meta) and bos is not None and bos_id is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0",
            pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, bos_id)],
        )
    else:
        tokenizer.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1")
    return str(tokenizer.to_str())


def add_bos_token(meta: Mapping[str, Any]) -> bool:
    """Whether encoding puts BOS first (llama.cpp's default: yes for SentencePiece only)."""
    default = meta.get("tokenizer.ggml.model") == "llama"
    return bool(meta.get("tokenizer.ggml.add_bos_token", default))


def special_token_id(meta: Mapping[str, Any], key: str) -> int | None:
    """The id ``tokenizer.ggml.<key>`` names, if any, as llama.cpp reads it (no BOS in a
    GLM-4 vocabulary, whatever the file says)."""
    token_id = meta.get(f"tokenizer.ggml.{key}")
    if token_id is None or (key == "bos_token_id" and meta.get("tokenizer.ggml.pre") in _NO_BOS):
        return None
    return int(token_id)


def special_token(meta: Mapping[str, Any], key: str) -> str | None:
    """The text of the token whose id ``tokenizer.ggml.<key>`` names, if any."""
    token_id = special_token_id(meta, key)
    tokens: Sequence[str] = meta["tokenizer.ggml.tokens"]
    if token_id is None or not 0 <= int(token_id) < len(tokens):
        return None
    return tokens[int(token_id)]


@cache
def _byte_alphabet() -> dict[int, str]:
    # GPT-2's reversible byte -> printable character table.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in chars)
    chars.update({b: chr(256 + n) for n, b in enumerate(extra)})
    return dict(sorted(chars.items()))


def _byte_level_bpe(meta: Mapping[str, Any]) -> Tokenizer:
    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    # A token stored with characters outside the byte alphabet is respelled byte by byte, as
    # transformers does; the last of two tokens with one spelling wins, as in a dict.
    vocab = {
        token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode()): index
        for index, token in enumerate(meta["tokenizer.ggml.tokens"])
    }
    merges = [_split_merge(m) for m in meta.get("tokenizer.ggml.merges", [])]
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
        )
    )
    tokenizer.pre_tokenizer = _byte_level_pre_tokenizer(meta.get("tokenizer.ggml.pre"))
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _split_merge(merge: str) -> tuple[str, str]:
    left, right = merge.split(" ", 1)
    return left, right


def _byte_level_pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    split = _PRE_SPLITS.get(pre or "")
    if split is not None:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_THEN_GPT2:
        digits = pre_tokenizers.Digits(individual_digits=True)
        return pre_tokenizers.Sequence([digits, byte_level])
    if pre not in _GPT2:
        logger.warning("GGUF pre-tokenizer %r is unknown; splitting text as GPT-2 does", pre)
    return byte_level


def _sentencepiece_bpe(meta: Mapping[str, Any]) -> Tokenizer:
    tokens = _sentencepiece_pieces(meta)
    vocab = {token: index for index, token in enumerate(tokens)}
    if "tokenizer.ggml.merges" in meta:
        merges = [_split_merge(m) for m in meta["tokenizer.ggml.merges"]]
    else:
        merges = _merges_from_ranks(vocab, _merge_ranks(meta, tokens))
    unk = special_token(meta, "unknown_token_id")
    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True)
    )
    decoder = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix(meta):
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="first", split=False
        )
        decoder.append(decoders.Strip(content=" ", left=1, right=0))
    else:  # spaces are spelled "▁", and nothing is put in front of the text
        tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.decoder = decoders.Sequence(decoder)
    return tokenizer


def add_space_prefix(meta: Mapping[str, Any]) -> bool:
    """Whether a SentencePiece vocabulary puts "▁" before the text (llama.cpp's default: yes)."""
    return bool(meta.get("tokenizer.ggml.add_space_prefix", True))


def _sentencepiece_pieces(meta: Mapping[str, Any]) -> list[str]:
    # llama.cpp writes Gemma's runs of spaces ("▁▁"...) with real spaces; the merges that make
    # them, and the normalized text they must match, spell them "▁".
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    if meta.get("general.architecture") not in _GEMMA_FAMILY:
        return tokens
    return ["▁" * len(t) if t and not t.strip(" ") else t for t in tokens]


def _merge_ranks(meta: Mapping[str, Any], tokens: Sequence[str]) -> dict[str, float]:
    # A merge ranks as the token it makes. SentencePiece scores give that order, except Gemma's:
    # its added pieces all score -1000, and the order of the file is its merge order.
    if meta.get("general.architecture") in _GEMMA_FAMILY:
        return {token: -float(index) for index, token in enumerate(tokens)}
    scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    return dict(zip(tokens, scores, strict=True))


def _merges_from_ranks(
    vocab: Mapping[str, int], ranks: Mapping[str, float]
) -> list[tuple[str, str]]:
    # SentencePiece files list no merges: every split of a token into two known pieces is a
    # merge, ranked by the merged token's rank (best first), then longest left piece first, as
    # transformers ranks them; ties keep the order of ``ranks`` (the sort is stable).
    ranked = [
        (token[:i], token[i:], rank)
        for token, rank in ranks.items()
        for i in range(1, len(token))
        if token[:i] in vocab and token[i:] in vocab
    ]
    ranked.sort(key=lambda p: (p[2], len(p[0]), len(p[1])), reverse=True)
    return [(left, right) for left, right, _ in ranked]


def _add_special_tokens(tokenizer: Tokenizer, meta: Mapping[str, Any], byte_level: bool) -> None:
    # Control tokens stay whole and are special; user-defined ones stay whole but are text.
    tokens: Sequence[str] = meta["tokenizer.ggml.tokens"]
    types: Sequence[int] = meta.get("tokenizer.ggml.token_type") or []
    alphabet = set(_byte_alphabet().values()) if byte_level else None
    control = [
        AddedToken(token, normalized=False, special=True)
        for token, kind in zip(tokens, types, strict=False)
        # A byte-level "control" token outside the byte alphabet is a llama.cpp mislabel.
        if kind == _CONTROL and (alphabet is None or set(token) <= alphabet)
    ]
    tokenizer.add_special_tokens(control)
    vocab = tokenizer.get_vocab()
    user = [
        AddedToken(token, normalized=False, special=False)
        for token, kind in zip(tokens, types, strict=False)
        if kind == _USER_DEFINED and token in vocab
    ]
    tokenizer.add_tokens(user)
