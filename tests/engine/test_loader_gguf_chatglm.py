"""llama.cpp's "chatglm" GGUF files (ChatGLM3, GLM-4-9B) against the tiny ChatGLM-format
checkpoint they were converted from (`tiny_gguf_chatglm`): config, weights and greedy tokens,
Q8_0 kept in its blocks, GLM-4's "chatglm-bpe" split, a ChatGLM3-style SentencePiece vocabulary,
GLM's turn format and turn ends."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jinja2
import pytest
import torch
from tokenizers import Tokenizer

from ferrollm import LLM, SamplingParams
from ferrollm.executor.chat_templates import CHATGLM3_CHAT_TEMPLATE, GLM4_CHAT_TEMPLATE
from ferrollm.executor.gguf_chatglm import qkv_rows
from ferrollm.executor.loader import ModelSource, load_model_source
from tiny_gguf_chatglm import write_tiny_chatglm_gguf

CONFIG_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rope_theta",
    "rope_scaling",
    "max_position_embeddings",
    "tie_word_embeddings",
    "attention_bias",
    "o_proj_bias",
    "mlp_bias",
    "partial_rotary_factor",
    "pad_token_id",
)
OPTIONS = {"dtype": "float32", "max_num_seqs": 4, "kv_cache_memory": "4MiB"}
#: Token ids, not text: the GGUF's GLM-4 split differs from the tiny tokenizer's by design.
#: (Prompts whose first tokens are clear winners: [100, 3, 9]'s is a near-tie Q8_0 flips.)
PROMPTS = [[5, 60, 70, 80, 90], [40, 41, 42], [200, 201, 202, 203, 204, 205, 17]]
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello"},
    {"role": "user", "content": "2+2?"},
]


@pytest.fixture(scope="module")
def hf_dir(tiny_model_factory: Callable[..., Path]) -> Path:
    return tiny_model_factory("chatglm")


@pytest.fixture(scope="module")
def gguf_path(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_chatglm_gguf(hf_dir, tmp_path_factory.mktemp("chatglm") / "t.gguf")


@pytest.fixture(scope="module")
def source(gguf_path: Path) -> ModelSource:
    return load_model_source(gguf_path)


def token_id(source: ModelSource, token: str) -> int:
    return int(Tokenizer.from_str(source.tokenizer_json).token_to_id(token))


def test_the_config_is_the_checkpoints(source: ModelSource, hf_dir: Path) -> None:
    ours, theirs = source.config, load_model_source(hf_dir).config
    assert ours.architecture == "GlmForCausalLM"
    for field in CONFIG_FIELDS:
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.rope_theta == 50000.0  # rope.freq_base: rope_ratio 5 times 10000
    assert ours.rms_norm_eps == pytest.approx(theirs.rms_norm_eps, rel=1e-6)  # float32
    # As llama.cpp reads GLM-4's files: no BOS; eos <|endoftext|>, and a turn ends where the
    # model opens the next one.
    assert ours.bos_token_id is None and not source.special_tokens.add_bos_token
    ends = ("<|endoftext|>", "<|user|>", "<|observation|>")
    assert ours.eos_token_ids == tuple(token_id(source, t) for t in ends)


def test_greedy_tokens_and_weights_are_the_checkpoints(gguf_path: Path, hf_dir: Path) -> None:
    ours, theirs = LLM(gguf_path, **OPTIONS), LLM(hf_dir, **OPTIONS)
    ours_weights = ours.engine.runner.model.state_dict()  # type: ignore[attr-defined]
    theirs_weights = theirs.engine.runner.model.state_dict()  # type: ignore[attr-defined]
    assert sorted(ours_weights) == sorted(theirs_weights)
    for name, tensor in theirs_weights.items():
        assert torch.equal(ours_weights[name], tensor), name
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    a, b = ours.generate(PROMPTS, params), theirs.generate(PROMPTS, params)
    for x, y in zip(a, b, strict=True):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids


def test_a_q8_0_file_keeps_its_fused_layers_quantized(
    hf_dir: Path, gguf_path: Path, tmp_path: Path
) -> None:
    quantized_path = write_tiny_chatglm_gguf(hf_dir, tmp_path / "q8.gguf", "Q8_0")
    quantized, dense = LLM(quantized_path, **OPTIONS), LLM(gguf_path, **OPTIONS)
    layer = quantized.engine.runner.model.model.layers[0]  # type: ignore[attr-defined]
    for fused in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj):
        assert fused.quantized is not None and fused.quantized.scheme == "Q8_0"
        assert fused.weight is None or fused.weight.dtype != torch.float32
    # A few tokens: the random tiny model has near-ties that Q8_0's rounding flips later on.
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    a, b = quantized.generate(PROMPTS, params), dense.generate(PROMPTS, params)
    for x, y in zip(a, b, strict=True):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids


def test_a_file_of_a_transformers_glm_keeps_q_k_v_apart(
    tiny_model_factory: Callable[..., Path], tmp_path: Path
) -> None:
    # The converter reads GlmForCausalLM directories too: attn_q/k/v, no fused tensor.
    hf_dir = tiny_model_factory("glm")
    path = write_tiny_chatglm_gguf(hf_dir, tmp_path / "glm.gguf")
    expected = dict(load_model_source(hf_dir).iter_weights(torch.float32))
    loaded = dict(load_model_source(path).iter_weights(torch.float32))
    assert sorted(loaded) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name


def test_chatglm_bpe_splits_text_as_llama_cpp(source: ModelSource) -> None:
    # Llama 3's regex: contractions in any case, digits in threes, a space kept before
    # letters (CJK included) but not before digits. GPT-2's would give "'", "M", " 12345".
    tokenizer = Tokenizer.from_str(source.tokenizer_json)
    text = "I'M 12345 你好world's\n\nok"
    assert tokenizer.pre_tokenizer is not None
    pieces = [text[a:b] for _, (a, b) in tokenizer.pre_tokenizer.pre_tokenize_str(text)]
    assert pieces == ["I", "'M", " ", "123", "45", " 你好world", "'s", "\n\n", "ok"]
    assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_glm4_control_tokens_stay_whole_and_nothing_comes_first(source: ModelSource) -> None:
    tokenizer = Tokenizer.from_str(source.tokenizer_json)
    ids = tokenizer.encode("[gMASK]<sop><|user|>\nHi<|assistant|>").ids
    heads = [token_id(source, t) for t in ("[gMASK]", "<sop>", "<|user|>")]
    assert ids[:3] == heads
    assert ids[-1] == token_id(source, "<|assistant|>")


def test_a_file_without_a_template_gets_glm4s(source: ModelSource) -> None:
    assert source.chat_template == GLM4_CHAT_TEMPLATE  # the vocabulary spells "<sop>"
    rendered = jinja2.Environment().from_string(GLM4_CHAT_TEMPLATE)
    text = rendered.render(messages=CONVERSATION, add_generation_prompt=True)
    assert text == (
        "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHi<|assistant|>\nHello"
        "<|user|>\n2+2?<|assistant|>\n"
    )


def test_a_chatglm3_sentencepiece_vocabulary(hf_dir: Path, tmp_path: Path) -> None:
    source = load_model_source(write_tiny_chatglm_gguf(hf_dir, tmp_path / "s.gguf", vocab="spm"))
    tokenizer = Tokenizer.from_str(source.tokenizer_json)
    # (Not leading spaces: like transformers, the "▁" put first joins them and one is lost.)
    for text in ["hello world", "the cat sat on the mat", "two  spaces ", "héllo wörld 😀"]:
        ids = tokenizer.encode(text).ids
        assert tokenizer.decode(ids) == text, text
        assert ids[0] != 1  # no BOS (add_bos_token false)
    ids = tokenizer.encode("[gMASK]sop<|user|>").ids
    assert ids == [token_id(source, t) for t in ("[gMASK]", "sop", "<|user|>")]
    assert source.chat_template == CHATGLM3_CHAT_TEMPLATE  # its start token is "sop"
    text = (
        jinja2.Environment()
        .from_string(CHATGLM3_CHAT_TEMPLATE)
        .render(messages=CONVERSATION[1:2], add_generation_prompt=True)
    )
    assert text == "[gMASK]sop<|user|>\n Hi<|assistant|>"
    ends = [2, token_id(source, "<|user|>"), token_id(source, "<|observation|>")]
    assert list(source.config.eos_token_ids) == ends


@pytest.mark.parametrize("key", ["attention.head_count", "attention.layer_norm_rms_epsilon"])
def test_a_file_without_a_required_key_names_it(hf_dir: Path, tmp_path: Path, key: str) -> None:
    path = write_tiny_chatglm_gguf(hf_dir, tmp_path / "bad.gguf", drop_key=key)
    with pytest.raises(ValueError, match=rf"`chatglm\.{key}`"):
        load_model_source(path)


def test_fused_qkv_rows_must_be_q_k_v() -> None:
    assert qkv_rows("blk.3.attn_qkv.bias", 128, 4, 2, 16) == [
        ("model.layers.3.self_attn.q_proj.bias", 0, 64),
        ("model.layers.3.self_attn.k_proj.bias", 64, 96),
        ("model.layers.3.self_attn.v_proj.bias", 96, 128),
    ]
    assert qkv_rows("blk.3.attn_output.weight", 64, 4, 2, 16) is None
    with pytest.raises(ValueError, match=r"blk\.0\.attn_qkv\.weight.* 96 rows"):
        qkv_rows("blk.0.attn_qkv.weight", 96, 4, 2, 16)
