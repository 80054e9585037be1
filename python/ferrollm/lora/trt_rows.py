"""TensorRT-LLM's LoRA tensors as an adapter (docs/api/trt.md#lora).

``lora_config`` ``[rows, 3]`` says what each row of ``lora_weights`` is: ``[module_id,
layer_idx, adapter_size]``. A ``lora_weights`` row holds, as TensorRT-LLM's converter writes
it, the adapter's ``lora_A`` ``[D, Hi]`` flattened, then its ``lora_B`` ``[Ho, D]`` already
scaled by ``alpha / r`` flattened, zero-padded to the longest row (``D`` = adapter_size, ``Hi`` /
``Ho`` the module's input / output size in the base model): rows are applied as given, there
is no alpha to read.

Module ids are TensorRT-LLM's (``LoraManager.LORA_MODULE_IDS``). Its converter maps
``mlp_h_to_4h`` (5) to ``gate_proj`` and ``mlp_gate`` (7) to ``up_proj``, while its
documentation calls 5 the up projection and 7 the gate: ids follow the converter, as the
weights people send were made by it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from ferrollm.lora.adapter import LoRAAdapter, LoRAError, LoRAWeights
from ferrollm.lora.targets import lora_targets

#: module_id -> (our merged module, the shards its B covers, in order).
MODULE_IDS: dict[int, tuple[str, tuple[str, ...]]] = {
    0: ("self_attn.qkv_proj", ("q_proj", "k_proj", "v_proj")),  # attn_qkv
    1: ("self_attn.qkv_proj", ("q_proj",)),  # attn_q
    2: ("self_attn.qkv_proj", ("k_proj",)),  # attn_k
    3: ("self_attn.qkv_proj", ("v_proj",)),  # attn_v
    4: ("self_attn.o_proj", ("o_proj",)),  # attn_dense
    5: ("mlp.gate_up_proj", ("gate_proj",)),  # mlp_h_to_4h
    6: ("mlp.down_proj", ("down_proj",)),  # mlp_4h_to_h
    7: ("mlp.gate_up_proj", ("up_proj",)),  # mlp_gate
}


def adapter_from_trt_rows(
    name: str,
    weights: npt.NDArray[np.floating],
    config: npt.NDArray[np.integer],
    model: nn.Module,
    max_lora_rank: int,
) -> LoRAAdapter:
    """The adapter ``lora_weights`` / ``lora_config`` describe for ``model``; LoRAError naming
    the tensor, the row and the rule it breaks."""
    if weights.ndim != 2 or config.ndim != 2 or config.shape[1] != 3:
        raise LoRAError("`lora_config` must be [rows, 3] and `lora_weights` [rows, width]")
    if len(weights) != len(config):
        raise LoRAError(f"`lora_weights` has {len(weights)} rows; `lora_config` has {len(config)}")
    if not np.isfinite(weights).all():
        raise LoRAError("`lora_weights` has non-finite values")
    targets = lora_targets(model)
    out: dict[tuple[int, str, str], LoRAWeights] = {}
    rank = 0
    for i, (module_id, layer, size) in enumerate(config.tolist()):
        where = f"`lora_config[{i}]` = [{module_id}, {layer}, {size}]"
        if module_id not in MODULE_IDS:
            known = ", ".join(str(k) for k in MODULE_IDS)
            raise LoRAError(f"{where}: module id {module_id} is not one of {known}")
        module, shards = MODULE_IDS[module_id]
        target = targets.get((layer, module))
        if target is None:
            raise LoRAError(f"{where}: the model has no layer {layer} {module}")
        if not 1 <= size <= max_lora_rank:
            raise LoRAError(f"{where}: adapter size {size} is not in [1, `max_lora_rank` "
                            f"{max_lora_rank}]")  # fmt: skip
        hi = target.in_features
        ho = sum(target.shard(s).num_rows for s in shards)
        if weights.shape[1] < size * (hi + ho):
            raise LoRAError(
                f"`lora_weights[{i}]` has {weights.shape[1]} values; {where} needs "
                f"{size} x {hi} + {ho} x {size} = {size * (hi + ho)}"
            )
        row = torch.from_numpy(np.ascontiguousarray(weights[i], dtype=np.float32))
        a = row[: size * hi].view(size, hi)
        b = row[size * hi : size * (hi + ho)].view(ho, size)
        offset = 0
        for shard in shards:
            rows = target.shard(shard).num_rows
            key = (layer, module, shard)
            if key in out:
                raise LoRAError(f"{where}: layer {layer} {shard} is given twice")
            out[key] = LoRAWeights(a, b[offset : offset + rows].contiguous())
            offset += rows
        rank = max(rank, size)
    if not out:
        raise LoRAError("`lora_config` has no rows")
    return LoRAAdapter(name, Path(name), rank, out)
