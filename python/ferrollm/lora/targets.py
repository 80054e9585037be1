"""Which of a model's layers an adapter may target, at the base model's full (pre-TP) sizes.

An adapter is a property of the base model, not of how a group splits it: its tensors are
checked against the full sizes (what transformers' model has), and each rank then takes its
share when a slot is filled (`Target.rows_of` / `Target.cols`). The targets are the decoder
layers' four merged projections of the Llama family (``ferrollm.models.llama``):
``self_attn.qkv_proj`` (shards q/k/v), ``self_attn.o_proj``, ``mlp.gate_up_proj`` (shards
gate/up) and ``mlp.down_proj``. A PEFT module name maps to one shard (``self_attn.k_proj``) or,
where the family's checkpoints store the merged projection (Phi-3's ``qkv_proj``, GLM's
``gate_up_proj``: ``fused_checkpoint``), to every shard of the merged layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from ferrollm.layers.linear import Linear

#: Our merged projections an adapter can add to, by path inside a decoder layer.
LORA_MODULES = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
#: PEFT ``target_modules`` names that map onto them (fused ones only where the family has them).
SHARD_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class TargetShard:
    """One projection of a merged layer: its full output rows and this rank's range of them."""

    name: str  # "k_proj"
    num_rows: int  # rows in the base model (all ranks)
    rows: tuple[int, int]  # this rank's [start, stop) of them
    local: slice  # where those rows sit in this rank's layer output (`Linear.shard_slices`)


@dataclass(frozen=True)
class Target:
    """One merged projection of one decoder layer, as an adapter sees it."""

    layer: Linear
    module: str  # "self_attn.qkv_proj"
    in_features: int  # input columns in the base model
    cols: tuple[int, int]  # this rank's [start, stop) of them (all, unless row-parallel)
    shards: tuple[TargetShard, ...]

    @property
    def row_parallel(self) -> bool:
        """Whether this rank holds only some input columns (o_proj/down_proj under TP)."""
        return self.cols != (0, self.in_features)

    def shard(self, name: str) -> TargetShard:
        """The shard called ``name`` (KeyError if the layer has none)."""
        return next(s for s in self.shards if s.name == name)


def lora_targets(model: nn.Module) -> dict[tuple[int, str], Target]:
    """``(layer index, module path) -> Target`` for every adaptable projection of ``model``;
    ValueError when the model is not of the Llama family's shape."""
    config: Any = getattr(model, "config", None)
    layout: Any = getattr(model, "layout", None)
    fused_parts: Any = getattr(model, "fused_parts", None)
    inner: Any = getattr(model, "model", None)
    if config is None or layout is None or fused_parts is None or inner is None:
        raise ValueError(f"LoRA adapters need a Llama-family model; got {type(model).__name__}")
    d = layout.head_dim
    row_inputs = {
        "self_attn.o_proj": (
            config.num_attention_heads * d,
            (layout.heads[0] * d, layout.heads[1] * d),
        ),
        "mlp.down_proj": (config.intermediate_size, layout.intermediate),
    }
    targets: dict[tuple[int, str], Target] = {}
    for i, block in enumerate(inner.layers):
        for module in LORA_MODULES:
            layer = block.get_submodule(module) if _has(block, module) else None
            if not isinstance(layer, Linear):
                continue  # a mixture-of-experts block, another attention: not adaptable
            shards: tuple[TargetShard, ...]
            if module in row_inputs:
                in_full, cols = row_inputs[module]
                (name,) = layer.shard_slices
                shards = (
                    TargetShard(
                        name, layer.out_features, (0, layer.out_features), layer.shard_slices[name]
                    ),
                )
            else:
                in_full, cols = layer.in_features, (0, layer.in_features)
                shards = tuple(
                    TargetShard(p.shard, p.rows, (p.start, p.stop), layer.shard_slices[p.shard])
                    for p in fused_parts[module]
                )
            targets[(i, module)] = Target(layer, module, in_full, tuple(cols), shards)
    return targets


def checkpoint_modules(model: nn.Module) -> dict[str, tuple[str, tuple[str, ...]]]:
    """PEFT module suffix (``self_attn.q_proj``) -> (our module path, the shards it covers):
    one shard each, plus the merged path itself where the family's checkpoints have it."""
    fused: frozenset[str] = getattr(model, "fused_checkpoint", frozenset())
    routes: dict[str, tuple[str, tuple[str, ...]]] = {
        "self_attn.q_proj": ("self_attn.qkv_proj", ("q_proj",)),
        "self_attn.k_proj": ("self_attn.qkv_proj", ("k_proj",)),
        "self_attn.v_proj": ("self_attn.qkv_proj", ("v_proj",)),
        "self_attn.o_proj": ("self_attn.o_proj", ("o_proj",)),
        "mlp.gate_proj": ("mlp.gate_up_proj", ("gate_proj",)),
        "mlp.up_proj": ("mlp.gate_up_proj", ("up_proj",)),
        "mlp.down_proj": ("mlp.down_proj", ("down_proj",)),
    }
    if "qkv_proj" in fused:
        routes["self_attn.qkv_proj"] = ("self_attn.qkv_proj", ("q_proj", "k_proj", "v_proj"))
    if "gate_up_proj" in fused:
        routes["mlp.gate_up_proj"] = ("mlp.gate_up_proj", ("gate_proj", "up_proj"))
    return routes


def _has(block: nn.Module, path: str) -> bool:
    try:
        block.get_submodule(path)
    except AttributeError:
        return False
    return True
