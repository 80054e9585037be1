"""DeepSeek-V2 / V2-Lite / V3 / R1 GGUF files (``general.architecture`` "deepseek2"), as
llama.cpp's converter (``DeepseekV2Model``) writes them and llama.cpp reads them, back as the
config.json of a ``DeepseekV2ForCausalLM`` / ``DeepseekV3ForCausalLM`` checkpoint.

* Version: the file has no model type; its router does. ``expert_gating_func`` 2 (sigmoid) is
  V3's scoring, read with the ``exp_probs_b`` correction bias; 1 (softmax), or no key at all
  (the first V2 files, which llama.cpp reads as softmax), is V2's.
* Head sizes: newer converters write the latent view (``head_count_kv`` 1, ``key_length``
  ``kv_lora_rank + qk_rope_head_dim``) and the per-head sizes under ``key_length_mla`` /
  ``value_length_mla``; older ones the per-head sizes under ``key_length`` / ``value_length``.
  As in llama.cpp, the ``_mla`` keys win where present, and the rope part is
  ``rope.dimension_count``.
* ``kv_b_proj``: older converters write it whole (``attn_kv_b``); newer ones split it per
  head into ``attn_k_b`` (transposed, ``[heads, kv_lora_rank, qk_nope_head_dim]``) and
  ``attn_v_b`` (``[heads, v_head_dim, kv_lora_rank]``), which `kv_b_parts` joins again. The
  model keeps ``kv_b_proj`` dense (its absorption reads the weight), so quantized halves are
  dequantized here and a quantized whole one by the layer.
* Rope: q and k are written unpermuted (DeepSeek turns adjacent pairs, llama.cpp's "norm"
  rope). YaRN's softmax term is the ``rope.scaling.yarn_log_multiplier`` key, which the
  converter writes as ``0.1 * mscale_all_dim``; llama.cpp leaves cos/sin unscaled, which is
  transformers' ``mscale == mscale_all_dim`` (every released DeepSeek config).
* Groups: ``expert_group_count`` / ``expert_group_used_count`` are ``n_group`` /
  ``topk_group``. V2 ranks a group by its best score (``group_limited_greedy``), as the
  checkpoint's own code does; llama.cpp ranks every model's groups by their two best, V3's
  rule, so on a V2 file with groups (DeepSeek-V2, V2.5; not V2-Lite) it can pick otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

import numpy as np

from ferrollm.distributed.shard_plan import ShardPlan
from ferrollm.executor.gguf_reader import GGUFFile, GGUFTensor
from ferrollm.models.config import UnsupportedModelError

#: Layer tensors named otherwise than Llama's. None: read with its pair (`kv_b_parts`). A name
#: ending in "_" takes the suffix without a dot: the router's correction bias is a parameter
#: of its own, not a layer's bias.
DEEPSEEK2_LAYER_TENSORS: Mapping[str, str | None] = {
    "attn_q_a": "self_attn.q_a_proj",
    "attn_q_a_norm": "self_attn.q_a_layernorm",
    "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_kv_b": "self_attn.kv_b_proj",
    "attn_k_b": None,
    "attn_v_b": None,
    "exp_probs_b": "mlp.gate.e_score_correction_",
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj",
}
#: The half of a split ``kv_b`` that `kv_b_parts` yields the joined tensor for: the other one
#: is no load step of its own.
JOINED_HALF = "attn_v_b"
_SPLIT_KV_B = re.compile(r"blk\.(\d+)\.attn_([kv])_b\.weight")
_GATING = {1: "softmax", 2: "sigmoid"}  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_*
_F32 = 0  # GGMLQuantizationType.F32


def deepseek2_fields(meta: Mapping[str, Any], tensor_names: Sequence[str]) -> dict[str, Any]:
    """The DeepSeek config.json fields of a "deepseek2" file (module docstring).

    Raises ValueError naming a required key the file lacks, UnsupportedModelError for a
    gating function DeepSeek does not use."""

    def get(key: str) -> Any:
        return meta.get(f"deepseek2.{key}")

    def need(key: str) -> Any:
        value = get(key)
        if value is None:
            raise ValueError(f"GGUF deepseek2 file lacks the `deepseek2.{key}` key")
        return value

    gating = _GATING.get(int(get("expert_gating_func") or 1))
    if gating is None:
        raise UnsupportedModelError(
            f"GGUF `deepseek2.expert_gating_func` {get('expert_gating_func')!r} is not "
            "DeepSeek's softmax (1) or sigmoid (2)"
        )
    v3 = gating == "sigmoid"
    q_lora = get("attention.q_lora_rank")
    if q_lora is None and "blk.0.attn_q_a.weight" in tensor_names:
        need("attention.q_lora_rank")  # a query bottleneck of unknown rank
    rope_dim = int(need("rope.dimension_count"))
    num_groups = int(get("expert_group_count") or 1)
    return {
        "architectures": ["DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v3" if v3 else "deepseek_v2",
        # The file's head_count_kv (1 in newer files) counts the latent cache's one "head".
        "num_key_value_heads": int(need("attention.head_count")),
        "head_dim": rope_dim,  # as transformers' config says it (the model reads mla sizes)
        "kv_lora_rank": int(need("attention.kv_lora_rank")),
        "q_lora_rank": None if q_lora is None else int(q_lora),
        "qk_rope_head_dim": rope_dim,
        "qk_nope_head_dim": _per_head(get, need, "key_length") - rope_dim,
        "v_head_dim": _per_head(get, need, "value_length"),
        "rope_interleave": True,
        "attention_bias": "blk.0.attn_kv_a_mqa.bias" in tensor_names,
        "n_routed_experts": int(need("expert_count")),
        "num_experts_per_tok": int(need("expert_used_count")),
        "moe_intermediate_size": int(need("expert_feed_forward_length")),
        "n_shared_experts": int(get("expert_shared_count") or 0),
        "first_k_dense_replace": int(get("leading_dense_block_count") or 0),
        "scoring_func": gating,
        "topk_method": "noaux_tc"
        if v3
        else "greedy"
        if num_groups == 1
        else "group_limited_greedy",
        "n_group": num_groups,
        "topk_group": int(get("expert_group_used_count") or 1),
        "routed_scaling_factor": _decimal(get("expert_weights_scale") or 1.0),
        "norm_topk_prob": bool(get("expert_weights_norm") or False),
        "rope_scaling": _yarn(meta),
    }


def _per_head(get: Any, need: Any, key: str) -> int:
    """A query/key (``key_length``) or value (``value_length``) head's size: the ``_mla`` key
    of newer files, else the plain one of older files (llama.cpp's ``n_embd_head_k_mla()``)."""
    return int(get(f"attention.{key}_mla") or need(f"attention.{key}"))


def _yarn(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """YaRN as llama.cpp runs a deepseek2 file: cos/sin unscaled (``attention_factor`` 1), the
    softmax scaled by ``mscale(factor, yarn_log_multiplier / 0.1) ** 2``. None without YaRN;
    other scalings are the generic keys' (`gguf_config`)."""
    if meta.get("deepseek2.rope.scaling.type") != "yarn":
        return None
    original = meta.get("deepseek2.rope.scaling.original_context_length")
    if original is None:
        raise ValueError(
            "GGUF deepseek2 file lacks the `deepseek2.rope.scaling.original_context_length` key"
        )
    scaling: dict[str, Any] = {
        "rope_type": "yarn",
        "factor": _decimal(meta.get("deepseek2.rope.scaling.factor") or 1.0),
        "original_max_position_embeddings": int(original),
        "attention_factor": 1.0,
        "beta_fast": _decimal(meta.get("deepseek2.rope.scaling.yarn_beta_fast") or 32.0),
        "beta_slow": _decimal(meta.get("deepseek2.rope.scaling.yarn_beta_slow") or 1.0),
    }
    log_multiplier = meta.get("deepseek2.rope.scaling.yarn_log_multiplier")
    if log_multiplier:
        # The converter wrote 0.1 * mscale_all_dim in float32: its shortest decimal, shifted.
        scaling["mscale_all_dim"] = float(Decimal(str(np.float32(log_multiplier))).scaleb(1))
    return scaling


def _decimal(value: float) -> float:
    """A float32 key as the decimal the converter wrote (its shortest round-trip form)."""
    return float(str(np.float32(value)))


def kv_b_parts(
    file: GGUFFile, shard: ShardPlan
) -> Iterator[tuple[GGUFTensor, str, np.ndarray[Any, Any], None]]:
    """Each layer's ``kv_b_proj`` joined from its ``attn_k_b`` and ``attn_v_b`` (dequantized):
    per head the ``qk_nope_head_dim`` key rows, then the ``v_head_dim`` value rows, as an F32
    tensor `GGUFCheckpoint._parts` passes on like any other (``shard``'s rows of it, this
    rank's heads, under tensor parallelism). Layers with a whole ``attn_kv_b`` are left to it.

    Raises ValueError for a half without its pair or halves whose sizes disagree."""
    from gguf import GGMLQuantizationType, dequantize

    names = {tensor.name for tensor in file.tensors}
    halves: dict[str, dict[str, GGUFTensor]] = {}
    for tensor in file.tensors:
        match = _SPLIT_KV_B.fullmatch(tensor.name)
        if match is not None and f"blk.{match[1]}.attn_kv_b.weight" not in names:
            halves.setdefault(match[1], {})[match[2]] = tensor
    for layer, pair in halves.items():
        if set(pair) != {"k", "v"}:
            (half,) = pair
            other = "v" if half == "k" else "k"
            raise ValueError(f"GGUF tensor `blk.{layer}.attn_{half}_b` has no attn_{other}_b")
        k_b, v_b = (
            dequantize(file.data(pair[h]), GGMLQuantizationType(pair[h].ggml_type)) for h in "kv"
        )
        if k_b.ndim != 3 or v_b.ndim != 3 or k_b.shape[:2] != (v_b.shape[0], v_b.shape[2]):
            raise ValueError(
                f"GGUF `blk.{layer}.attn_k_b` {k_b.shape} and `attn_v_b` {v_b.shape} are not "
                "[heads, kv_lora_rank, qk_nope_head_dim] and [heads, v_head_dim, kv_lora_rank]"
            )
        rows = np.concatenate((k_b.transpose(0, 2, 1), v_b), axis=1).reshape(-1, k_b.shape[1])
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        joined = GGUFTensor(f"blk.{layer}.attn_kv_b.weight", rows.shape, _F32, offset=-1)
        name = f"model.layers.{layer}.self_attn.kv_b_proj.weight"
        part = shard.slice_of(name)  # rows: the rank's heads (`DeepseekForCausalLM.shard_plan`)
        if part is not None:
            rows = rows[part.start : part.stop]
        yield joined, name, rows, None
