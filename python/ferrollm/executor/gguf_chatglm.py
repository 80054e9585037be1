"""ChatGLM3 and GLM-4(-9B) GGUF files (``general.architecture`` "chatglm"), as llama.cpp's
converter (``ChatGLMModel``) writes them and llama.cpp reads them.

The converter writes the original checkpoints' tensors under llama.cpp's names without
permuting them (GLM's rope already turns adjacent pairs, as llama.cpp's "normal" rope does):
q/k/v as one ``attn_qkv`` with its bias, rows q, k, v (multi-query groups of
``attention.head_count_kv``), and gate/up as one ``ffn_up`` ([gate; up], ``dense_h_to_4h``). It
writes no key or value length, so a head is ``embedding_length / head_count`` wide, and rope
turns ``rope.dimension_count`` of its dims (half). ``rope.freq_base`` is 10000 times the
checkpoint's ``rope_ratio`` (GLM-4's long-context models). Files converted from a transformers
``GlmForCausalLM`` keep q/k/v apart; both load as `GlmForCausalLM`, ``attn_qkv`` split into
the projections it holds (`qkv_rows`), as llama.cpp views q, k and v in it.

GLM-4's vocabulary is byte-level BPE (``tokenizer.ggml.pre`` "chatglm-bpe"), ChatGLM3's
SentencePiece; neither puts BOS first. A chat turn ends where the model starts the next one:
``<|user|>`` (llama.cpp's end-of-turn token in GLM-4's files) or ``<|observation|>`` (a tool's
answer), as the models' ``generation_config.json`` lists them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

#: Layer tensors named otherwise than Llama's: gate/up as one tensor (``attn_qkv`` is split).
CHATGLM_LAYER_TENSORS = {"ffn_up": "mlp.gate_up_proj"}
#: The keys llama.cpp cannot load a "chatglm" file without.
REQUIRED_KEYS = (
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.layer_norm_rms_epsilon",
)
#: Control tokens that start the next turn: generation ends there.
END_OF_TURN_TOKENS = ("<|user|>", "<|observation|>")
_QKV = re.compile(r"blk\.(\d+)\.attn_qkv\.(weight|bias)")


def check_required_keys(meta: Mapping[str, Any]) -> None:
    """Raise ValueError naming the first key of `REQUIRED_KEYS` the file lacks."""
    for key in REQUIRED_KEYS:
        if meta.get(f"chatglm.{key}") is None:
            raise ValueError(f"GGUF metadata lacks `chatglm.{key}`, which a chatglm file needs")


def chatglm_fields(
    meta: Mapping[str, Any], tensor_names: Sequence[str], eos_token_ids: list[int]
) -> dict[str, Any]:
    """The ``config.json`` fields of the `GlmForCausalLM` a "chatglm" file loads as, beyond
    the Llama keys: rope's share of each head, q/k/v biases, no BOS and the turn ends."""
    head_dim = int(meta["chatglm.embedding_length"]) // int(meta["chatglm.attention.head_count"])
    rotary_dim = int(meta.get("chatglm.rope.dimension_count") or head_dim)
    names = set(tensor_names)
    tokens: Sequence[str] = meta["tokenizer.ggml.tokens"]
    types: Sequence[int] = meta.get("tokenizer.ggml.token_type") or []
    control = {t for t, kind in zip(tokens, types, strict=False) if kind == 3}
    ends = [tokens.index(t) for t in END_OF_TURN_TOKENS if t in control]
    return {
        "model_type": "glm",
        "head_dim": head_dim,
        "partial_rotary_factor": rotary_dim / head_dim,
        "attention_bias": bool({"blk.0.attn_qkv.bias", "blk.0.attn_q.bias"} & names),
        # GLM-4's vocabulary has no BOS for llama.cpp; ChatGLM3's is never put first.
        "bos_token_id": None,
        "eos_token_id": list(dict.fromkeys([*eos_token_ids, *ends])),
    }


def qkv_rows(
    gguf_name: str, num_rows: int, num_heads: int, num_kv_heads: int, head_dim: int
) -> list[tuple[str, int, int]] | None:
    """For a fused ``blk.N.attn_qkv`` weight or bias of ``num_rows`` rows: the transformers
    name of each projection it holds with its rows ``[start, stop)`` (q, then k, then v); None
    for any other tensor. Raises ValueError when the rows are not q's, k's and v's."""
    match = _QKV.fullmatch(gguf_name)
    if match is None:
        return None
    prefix, suffix = f"model.layers.{match[1]}.self_attn", match[2]
    q, kv = num_heads * head_dim, num_kv_heads * head_dim
    if num_rows != q + 2 * kv:
        raise ValueError(
            f"GGUF tensor {gguf_name!r} has {num_rows} rows; {num_heads} query and "
            f"{num_kv_heads} key/value heads of {head_dim} make {q + 2 * kv}"
        )
    spans = {"q_proj": (0, q), "k_proj": (q, q + kv), "v_proj": (q + kv, q + 2 * kv)}
    return [(f"{prefix}.{proj}.{suffix}", start, stop) for proj, (start, stop) in spans.items()]
