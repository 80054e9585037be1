"""Tiny saved models converted to GGUF as llama.cpp's ``convert_hf_to_gguf.py`` would write
them (``write_tiny_gguf``): its metadata keys, tensor names, q/k permutation and, for the
mixture-of-experts families, its stacked expert tensors; shared like `tiny_models`."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch

from tiny_models import CHATML_TEMPLATE

GGUF_FAMILIES = {
    "tied": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "llama-bias": "llama",
    "gemma2": "gemma2",
    "mixtral": "llama",
    "qwen2-moe": "qwen2moe",
    "qwen3-moe": "qwen3moe",
    "phi3": "phi3",
    "glm4": "glm4",
    "deepseek-v2": "deepseek2",  # tiny_gguf_deepseek
    "deepseek-v3": "deepseek2",
}
#: Per-expert tensor names (transformers 5's, Mixtral's) -> llama.cpp's stacked tensor.
_EXPERT_NAME = re.compile(
    r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight"
)
_STACKED = {
    "gate_proj": "ffn_gate_exps",
    "w1": "ffn_gate_exps",
    "up_proj": "ffn_up_exps",
    "w3": "ffn_up_exps",
    "down_proj": "ffn_down_exps",
    "w2": "ffn_down_exps",
}


def write_tiny_gguf(hf_dir: Path, path: Path, arch: str, quant_type: str | None = None) -> Path:
    """Convert a tiny saved model to a GGUF, as llama.cpp's converter would: all F32, or with
    every weight matrix (embeddings included) in ``quant_type`` ("Q4_1", "Q8_0", ...)."""
    import gguf

    if arch == "deepseek2":  # its own keys and tensor layout
        from tiny_gguf_deepseek import write_tiny_deepseek_gguf

        return write_tiny_deepseek_gguf(hf_dir, path, quant_type)
    config = json.loads((hf_dir / "config.json").read_text())
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name("tiny")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    if arch in ("qwen3", "gemma2", "glm4"):
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    if "num_experts_per_tok" in config:
        _write_gguf_moe_params(writer, config, arch)
    if arch == "gemma2":
        writer.add_sliding_window(config["sliding_window"])
        writer.add_float32("gemma2.attn_logit_softcapping", config["attn_logit_softcapping"])
        writer.add_float32("gemma2.final_logit_softcapping", config["final_logit_softcapping"])
    elif arch == "phi3":
        _write_gguf_phi3(writer, config)
    elif arch == "glm4":  # Glm4Model: rope over partial_rotary_factor of head_dim
        partial = config["rope_parameters"].get("partial_rotary_factor", 0.5)
        writer.add_rope_dimension_count(int(config["head_dim"] * partial))
    else:
        writer.add_rope_dimension_count(config["hidden_size"] // config["num_attention_heads"])
    _write_gguf_tokenizer(writer, hf_dir, config["vocab_size"])
    _write_gguf_tensors(writer, hf_dir, config, arch, quant_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_gguf_phi3(writer: Any, config: dict[str, Any]) -> None:
    # convert_hf_to_gguf.py's Phi3MiniModel: rotary dims, original context and the long-rope
    # cos/sin scale as keys, no scaling type; the factors as two F32 tensors; window 0 if none.
    import numpy as np

    rope = config["rope_parameters"]
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    writer.add_rope_dimension_count(int(rope.get("partial_rotary_factor", 1.0) * hidden) // heads)
    writer.add_sliding_window(config.get("sliding_window") or 0)
    if rope.get("rope_type") != "longrope":
        return
    original = config["original_max_position_embeddings"]
    scale = config["max_position_embeddings"] / original
    writer.add_rope_scaling_orig_ctx_len(original)
    attention = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0
    writer.add_rope_scaling_attn_factors(attention)
    writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], np.float32))
    writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], np.float32))


def _write_gguf_moe_params(writer: Any, config: dict[str, Any], arch: str) -> None:
    # As convert_hf_to_gguf.py's Mixtral / Qwen2MoeModel / Qwen3MoeModel write them; and
    # expert_weights_norm, which llama.cpp's newer converters write where a config sets it.
    writer.add_expert_count(config.get("num_local_experts") or config["num_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    if arch != "llama":
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if arch == "qwen2moe":
        writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])
    if arch == "qwen3moe":
        writer.add_expert_weights_norm(bool(config["norm_topk_prob"]))


def _write_gguf_tokenizer(writer: Any, hf_dir: Path, vocab_size: int) -> None:
    tokenizer = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    special = {t["content"] for t in tokenizer["added_tokens"] if t["special"]}
    tokens = sorted(vocab, key=vocab.__getitem__)
    types = [3 if t in special else 1 for t in tokens]  # 3: control
    padding = range(len(tokens), vocab_size)  # llama.cpp pads to the model's vocab, unused
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list([*tokens, *(f"[PAD{i}]" for i in padding)])
    writer.add_token_types([*types, *(5 for _ in padding)])  # 5: unused
    merges = tokenizer["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)


def _write_gguf_tensors(
    writer: Any, hf_dir: Path, config: dict[str, Any], arch: str, quant_type: str | None
) -> None:
    import gguf
    from safetensors.torch import load_file

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config["num_hidden_layers"])
    dense_names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config["num_hidden_layers"])
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    for hf_name, array in _stack_experts(load_file(hf_dir / "model.safetensors")).items():
        if arch == "llama" and ".q_proj." in hf_name:
            array = _llama_cpp_permute(array, heads)
        if arch == "llama" and ".k_proj." in hf_name:
            array = _llama_cpp_permute(array, kv_heads)
        if arch == "gemma2" and hf_name.endswith("norm.weight"):
            array = array + 1.0  # llama.cpp stores Gemma's norms as 1 + w
        name = _gguf_name(hf_name, names, dense_names)
        # llama.cpp keeps the routers in float (convert_hf_to_gguf.py: FFN_GATE_INP).
        if quant_type is not None and array.ndim >= 2 and "ffn_gate_inp" not in name:
            kind = gguf.GGMLQuantizationType[quant_type]
            writer.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, array)


def _llama_cpp_permute(array: Any, num_heads: int) -> Any:
    # convert_hf_to_gguf.py's LlamaModel.permute: rotary halves -> interleaved pairs.
    shape = array.shape
    grouped = array.reshape(num_heads, 2, shape[0] // num_heads // 2, *shape[1:])
    return grouped.swapaxes(1, 2).reshape(shape)


def _gguf_name(hf_name: str, names: Any, dense_names: Any) -> str:
    if hf_name.startswith("blk."):  # `_stack_experts` named it already
        return hf_name
    suffixes = (".weight", ".bias")
    # llama.cpp's Qwen MoE maps have no dense-MLP names (the released models have no dense
    # layers): the tiny Qwen2-MoE's dense layer 0 is written under Llama's ffn_* names.
    name = names.get_name(hf_name, try_suffixes=suffixes) or dense_names.get_name(
        hf_name, try_suffixes=suffixes
    )
    if name is None:
        raise ValueError(f"no GGUF name for {hf_name!r}")
    return str(name)


def _stack_experts(tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """float32 arrays by name, each layer's per-expert matrices stacked as llama.cpp's
    ``blk.N.ffn_{gate,up,down}_exps.weight [num_experts, rows, cols]`` (named so already)."""
    import numpy as np

    arrays: dict[str, Any] = {}
    stacks: dict[str, dict[int, Any]] = {}
    for hf_name, tensor in tensors.items():
        match = _EXPERT_NAME.fullmatch(hf_name)
        if match is None:
            arrays[hf_name] = tensor.float().numpy()
            continue
        stack = f"blk.{match[1]}.{_STACKED[match[3]]}.weight"
        stacks.setdefault(stack, {})[int(match[2])] = tensor.float().numpy()
    for stack, experts in stacks.items():
        arrays[stack] = np.stack([experts[e] for e in sorted(experts)])
    return arrays
