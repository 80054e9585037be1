"""Phi-3 / Phi-4 GGUF files (``general.architecture`` "phi3"): what llama.cpp's converter
(``Phi3MiniModel``) writes beyond the Llama keys, read back as config.json fields.

The converter writes q/k/v as one ``attn_qkv`` and gate/up as one ``ffn_up`` ([gate; up], the
order transformers' ``gate_up_proj`` chunks), neither permuted: they are our fused checkpoint
tensors as they stand. Long rope has no scaling-type key: its per-frequency factors are two
tensors, its context the ``rope.scaling.original_context_length`` key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ferrollm.executor.gguf_reader import GGUFFile

#: Layer tensors named otherwise than Llama's: the fused projections.
PHI3_LAYER_TENSORS = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
#: The long-rope factor tensors -> the ``rope_parameters`` lists they hold (no weights).
ROPE_FACTOR_TENSORS = {
    "rope_factors_short.weight": "short_factor",
    "rope_factors_long.weight": "long_factor",
}


def rope_factor_lists(file: GGUFFile) -> dict[str, list[float]]:
    """The file's long-rope factor tensors as config lists. They are float32 copies of the
    config's decimals; the shortest decimal that rounds to each is that decimal again."""
    lists = {}
    for tensor in file.tensors:
        key = ROPE_FACTOR_TENSORS.get(tensor.name)
        if key is not None:
            values = np.asarray(file.data(tensor), dtype=np.float32).reshape(-1)
            lists[key] = [float(str(value)) for value in values]
    return lists


def phi3_fields(
    meta: Mapping[str, Any], rope_factors: Mapping[str, Sequence[float]]
) -> dict[str, Any]:
    """Partial rotary (``rope.dimension_count`` of each head's dims), the window (0: none, as
    Phi-4 files say it) and long rope when the file carries its factors."""
    head_dim = int(meta["phi3.embedding_length"]) // int(meta["phi3.attention.head_count"])
    rotary_dim = int(meta.get("phi3.rope.dimension_count") or head_dim)
    window = int(meta.get("phi3.attention.sliding_window") or 0)
    fields: dict[str, Any] = {
        "partial_rotary_factor": rotary_dim / head_dim,
        "sliding_window": window or None,
    }
    if not rope_factors:
        return fields
    if set(rope_factors) != set(ROPE_FACTOR_TENSORS.values()):
        raise ValueError(f"GGUF long rope needs both {', '.join(ROPE_FACTOR_TENSORS)}")
    max_len = int(meta["phi3.context_length"])
    original = int(meta.get("phi3.rope.scaling.original_context_length") or max_len)
    params: dict[str, Any] = {
        "rope_type": "longrope",
        "rope_theta": float(meta.get("phi3.rope.freq_base", 10000.0)),
        "original_max_position_embeddings": original,
        **rope_factors,
    }
    attention = meta.get("phi3.rope.scaling.attn_factor")
    if attention is not None and not math.isclose(
        attention, _default_attention_factor(max_len / original, original), rel_tol=1e-6
    ):
        # The key is float32: only a factor the config chose itself is worth its rounding.
        params["attention_factor"] = float(attention)
    fields["original_max_position_embeddings"] = original
    fields["rope_parameters"] = params
    return fields


def _default_attention_factor(factor: float, original: int) -> float:
    # transformers' (and the converter's) long-rope cos/sin scale for a context `factor` times
    # the original.
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
