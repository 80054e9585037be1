"""The tiny DeepSeek-V2/V3 models (``tiny_models`` "deepseek-v2", "deepseek-v3") converted to
a "deepseek2" GGUF as llama.cpp's ``convert_hf_to_gguf.py`` (``DeepseekV2Model``) writes one:
``write_tiny_deepseek_gguf``, through `tiny_gguf.write_tiny_gguf` or with a chosen layout.

Layouts: "split" is the current converter's (``kv_b_proj`` split per head into a transposed
``attn_k_b`` and ``attn_v_b``, the latent view under ``key_length`` / ``value_length`` and
``head_count_kv`` 1, the per-head sizes under the ``_mla`` keys); "kv_b" the older one (one
``attn_kv_b``, per-head sizes under the plain keys, no ``_mla`` keys, ``head_count_kv`` the
config's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

KV_B_LAYOUTS = ("split", "kv_b")


def write_tiny_deepseek_gguf(
    hf_dir: Path, path: Path, quant_type: str | None = None, layout: str = "split"
) -> Path:
    """Convert a tiny saved DeepSeek model to a "deepseek2" GGUF in ``layout`` (all F32, or
    every weight matrix in ``quant_type`` where its rows are whole blocks)."""
    import gguf

    from tiny_gguf import _write_gguf_tokenizer

    config = json.loads((hf_dir / "config.json").read_text())
    writer = gguf.GGUFWriter(path, "deepseek2")
    writer.add_name("tiny")
    _write_params(writer, config, layout)
    _write_gguf_tokenizer(writer, hf_dir, config["vocab_size"])
    _write_tensors(writer, hf_dir, config, quant_type, layout)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_params(writer: Any, config: dict[str, Any], layout: str) -> None:
    import gguf

    heads, rank, rope = (
        config["num_attention_heads"],
        config["kv_lora_rank"],
        config["qk_rope_head_dim"],
    )
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_leading_dense_block_count(config["first_k_dense_replace"])
    if config.get("q_lora_rank") is not None:
        writer.add_q_lora_rank(config["q_lora_rank"])
    writer.add_kv_lora_rank(rank)
    qk_head = config["qk_nope_head_dim"] + rope
    if layout == "split":  # MLA as multi-query attention over the latent
        writer.add_head_count_kv(1)
        writer.add_key_length(rank + rope)
        writer.add_value_length(rank)
        writer.add_key_length_mla(qk_head)
        writer.add_value_length_mla(config["v_head_dim"])
    else:
        writer.add_head_count_kv(config["num_key_value_heads"])
        writer.add_key_length(qk_head)
        writer.add_value_length(config["v_head_dim"])
    writer.add_rope_dimension_count(rope)
    # The MoE keys: the base converter's (count, used, groups, gating), then DeepseekV2Model's.
    writer.add_expert_count(config["n_routed_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_expert_group_count(config["n_group"])
    writer.add_expert_group_used_count(config["topk_group"])
    sigmoid = config["model_type"] == "deepseek_v3"
    gating = gguf.ExpertGatingFuncType.SIGMOID if sigmoid else gguf.ExpertGatingFuncType.SOFTMAX
    writer.add_expert_gating_func(gating)
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    writer.add_expert_shared_count(config["n_shared_experts"])
    writer.add_expert_weights_scale(config["routed_scaling_factor"])
    if config.get("norm_topk_prob"):  # written only when set
        writer.add_expert_weights_norm(True)
    _write_rope(writer, config["rope_parameters"])


def _write_rope(writer: Any, rope: dict[str, Any]) -> None:
    import gguf

    writer.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") != "yarn":
        return
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(rope["factor"])
    writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    writer.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
    writer.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    # The converter's (legacy) convention: 0.1 * mscale_all_dim, not mscale_all_dim itself.
    writer.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])


def _write_tensors(
    writer: Any, hf_dir: Path, config: dict[str, Any], quant_type: str | None, layout: str
) -> None:
    import gguf
    from safetensors.torch import load_file

    from tiny_gguf import _stack_experts

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DEEPSEEK2, config["num_hidden_layers"])
    for hf_name, array in _stack_experts(load_file(hf_dir / "model.safetensors")).items():
        if hf_name.endswith("kv_b_proj.weight") and layout == "split":
            k_b, v_b = _split_kv_b(array, config)
            _add(writer, _gguf_name(hf_name.replace("kv_b", "k_b"), names), k_b, quant_type)
            _add(writer, _gguf_name(hf_name.replace("kv_b", "v_b"), names), v_b, quant_type)
            continue
        # The converter renames the router's bias to a bias of "e_score_correction".
        hf_name = hf_name.replace(".e_score_correction_bias", ".e_score_correction.bias")
        _add(writer, _gguf_name(hf_name, names), array, quant_type)


def _split_kv_b(array: Any, config: dict[str, Any]) -> tuple[Any, Any]:
    """Per head: the key rows transposed ``[heads, rank, nope]``, the value rows as they are
    ``[heads, v, rank]``."""
    nope, v = config["qk_nope_head_dim"], config["v_head_dim"]
    per_head = array.reshape(config["num_attention_heads"], nope + v, array.shape[-1])
    return per_head[:, :nope].transpose(0, 2, 1).copy(), per_head[:, nope:].copy()


def _add(writer: Any, name: str, array: Any, quant_type: str | None) -> None:
    import gguf

    kind = None if quant_type is None else gguf.GGMLQuantizationType[quant_type]
    # Routers stay float; rows that are not whole blocks cannot be quantized (the converter
    # falls back to F16 there; F32 keeps these weights exact).
    block = 0 if kind is None else gguf.GGML_QUANT_SIZES[kind][0]
    if kind is None or array.ndim < 2 or "ffn_gate_inp" in name or array.shape[-1] % block:
        writer.add_tensor(name, array)
    else:
        writer.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)


def _gguf_name(hf_name: str, names: Any) -> str:
    if hf_name.startswith("blk."):  # stacked experts, named already
        return hf_name
    name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    if name is None:
        raise ValueError(f"no GGUF name for {hf_name!r}")
    return str(name)
