"""The tiny "chatglm" model (ChatGLM3's checkpoint format, `tiny_models.to_chatglm`) converted
to a "chatglm" GGUF as llama.cpp's ``convert_hf_to_gguf.py`` (``ChatGLMModel``) would write it:
its keys (no key length; context from ``seq_length``; rope base 10000 * ``rope_ratio``; half of
each head rotated), its tensors (``transformer.`` dropped, names from gguf's CHATGLM map, fused
q/k/v and gate/up as they stand) and one of its two vocabularies: GLM-4's byte-level BPE
(pre "chatglm-bpe"; the tiny vocabulary plus GLM's control tokens) or a ChatGLM3-like
SentencePiece one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: GLM's control tokens (GLM-4 spelling; ChatGLM3 spells the start/end tokens "sop"/"eop").
GLM_SPECIAL_TOKENS = [
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
]
CHATGLM3_SPECIAL_TOKENS = [{"<sop>": "sop", "<eop>": "eop"}.get(t, t) for t in GLM_SPECIAL_TOKENS]
SPM_WORDS = ["hello", "world", "the", "cat", "sat", "on", "mat"]
_CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 3, 4, 5, 6


def write_tiny_chatglm_gguf(
    hf_dir: Path,
    path: Path,
    quant_type: str | None = None,
    vocab: str = "bpe",
    drop_key: str | None = None,
) -> Path:
    """Convert a tiny ChatGLM-format (or transformers GLM) directory to a "chatglm" GGUF: all
    F32, or every weight matrix in ``quant_type``; ``vocab`` "bpe" (GLM-4) or "spm"
    (ChatGLM3); ``drop_key`` (``"attention.head_count"``, say) left out of the metadata."""
    import gguf

    config = json.loads((hf_dir / "config.json").read_text())
    writer = gguf.GGUFWriter(path, "chatglm")
    for key, value in _params(config).items():
        if key != drop_key:
            writer.add_key_value(f"chatglm.{key}", *value)
    writer.add_file_type(0)
    vocab_size = config.get("padded_vocab_size", config.get("vocab_size"))
    if vocab == "bpe":
        _write_glm4_vocab(writer, hf_dir, vocab_size)
    else:
        _write_chatglm3_vocab(writer, vocab_size)
    writer.add_add_bos_token(False)
    _write_tensors(writer, hf_dir, quant_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _params(config: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    # ChatGLMModel.set_gguf_parameters: ChatGLM's keys first, transformers GLM's as fallback.
    from gguf import GGUFValueType as T

    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads = config.get("multi_query_group_num", config.get("num_key_value_heads", heads))
    layers = config.get("num_layers", config.get("num_hidden_layers"))
    ffn = config.get("ffn_hidden_size", config.get("intermediate_size", 4 * hidden))
    return {
        "context_length": (config.get("seq_length", hidden), T.UINT32),
        "embedding_length": (hidden, T.UINT32),
        "feed_forward_length": (ffn, T.UINT32),
        "block_count": (layers, T.UINT32),
        "attention.head_count": (heads, T.UINT32),
        "attention.head_count_kv": (kv_heads, T.UINT32),
        "attention.layer_norm_rms_epsilon": (config.get("layernorm_epsilon", 1e-5), T.FLOAT32),
        "rope.dimension_count": (int(hidden // heads * 0.5), T.UINT32),
        "rope.freq_base": (10000.0 * config.get("rope_ratio", 1.0), T.FLOAT32),
    }


def _write_glm4_vocab(writer: Any, hf_dir: Path, vocab_size: int) -> None:
    # get_vocab_base: the vocabulary by id, padded to the model's; GLM's control tokens here
    # take the first padding slots. eos and unk <|endoftext|>, eot <|user|>; the tokenizer's
    # BOS is written too, and llama.cpp drops it for "chatglm-bpe".
    tokenizer = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    special = {t["content"] for t in tokenizer["added_tokens"] if t["special"]}
    tokens = sorted(vocab, key=vocab.__getitem__) + GLM_SPECIAL_TOKENS
    types = [_CONTROL if t in special or t in GLM_SPECIAL_TOKENS else 1 for t in tokens]
    padding = range(len(tokens), vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("chatglm-bpe")
    writer.add_token_list([*tokens, *(f"[PAD{i}]" for i in padding)])
    writer.add_token_types([*types, *(_UNUSED for _ in padding)])
    merges = tokenizer["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(vocab["<|im_start|>"])
    writer.add_eos_token_id(vocab["<|endoftext|>"])
    writer.add_eot_token_id(tokens.index("<|user|>"))
    writer.add_unk_token_id(vocab["<|endoftext|>"])
    writer.add_pad_token_id(vocab["<|endoftext|>"])


def _write_chatglm3_vocab(writer: Any, vocab_size: int) -> None:
    # set_vocab_chatglm3: the SentencePiece pieces with their scores (ids 0-2 renamed <unk>,
    # <bos>, <eos>), then GLM's added tokens as control; no merges.
    letters = sorted({c for w in SPM_WORDS for c in w})
    pieces = ["\u2581", *letters, *SPM_WORDS, *(f"\u2581{w}" for w in SPM_WORDS)]
    pieces += [f"\u2581{c}" for c in letters]
    tokens = ["<unk>", "<bos>", "<eos>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    types = [2, _CONTROL, _CONTROL, *([_BYTE] * 256), *([1] * len(pieces))]
    scores = [0.0] * 259 + [float(-len(p) * 100 + i) for i, p in enumerate(pieces)]
    tokens += CHATGLM3_SPECIAL_TOKENS
    types += [_CONTROL] * len(CHATGLM3_SPECIAL_TOKENS)
    padding = range(len(tokens), vocab_size)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("chatglm-spm")
    writer.add_token_list([*tokens, *(f"[PAD{i}]" for i in padding)])
    writer.add_token_scores(scores + [0.0] * (vocab_size - len(scores)))
    writer.add_token_types([*types, *(_UNUSED for _ in padding)])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)


def _write_tensors(writer: Any, hf_dir: Path, quant_type: str | None) -> None:
    import gguf
    from safetensors.torch import load_file

    tensors = load_file(hf_dir / "model.safetensors")
    num_layers = 1 + max(
        int(n.split("layers.")[1].split(".")[0]) for n in tensors if "layers." in n
    )
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.CHATGLM, num_layers)
    for hf_name, tensor in tensors.items():
        if hf_name.endswith(".rotary_pos_emb.inv_freq"):
            continue
        name = names.get_name(
            hf_name.removeprefix("transformer."), try_suffixes=(".weight", ".bias")
        )
        if name is None:
            raise ValueError(f"no GGUF name for {hf_name!r}")
        array = tensor.float().numpy()
        if quant_type is not None and array.ndim >= 2:
            kind = gguf.GGMLQuantizationType[quant_type]
            writer.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, array)
