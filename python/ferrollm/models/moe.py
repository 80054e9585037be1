"""Mixture of experts: Mixtral, Qwen2-MoE and Qwen3-MoE on the Llama decoder.

Attention, norms, rope, the KV cache and the head are the Llama model's (Mixtral's attention is
Mistral's, Qwen2-MoE's Qwen2's with its q/k/v bias, Qwen3-MoE's Qwen3's with its q/k norm: all
switches of ``ModelConfig``). What differs is the MLP of the sparse layers (``ModelConfig.moe``,
``ferrollm.models.moe_config``): a router (``mlp.gate``) picks the top-k of ``num_experts``
gated experts per token (``ferrollm.layers.fused_moe``), and Qwen2-MoE adds a shared expert
whose output is scaled by ``sigmoid(shared_expert_gate(x))``. Qwen's dense layers
(``mlp_only_layers``, ``decoder_sparse_step``) keep the Llama MLP.

Checkpoints name experts three ways, all loaded (`MoeForCausalLM.checkpoint_tensors` turns
them into the per-expert names this model routes, ``mlp.experts.N.{gate,up,down}_proj``):

* what transformers 5 writes to disk, and older Qwen checkpoints: those per-expert names;
* Mixtral's on disk: ``block_sparse_moe.experts.N.w1`` (gate), ``w3`` (up), ``w2`` (down) and
  ``block_sparse_moe.gate`` (the router);
* a transformers 5 model's ``state_dict()``: fused ``mlp.experts.gate_up_proj [E, 2I, H]``
  and ``mlp.experts.down_proj [E, H, I]``.

The router and the shared expert's gate stay dense under a ``quantization`` scheme (a few
rows each, and the routing decision is the most rounding-sensitive product of the layer); the
experts are quantized like any MLP. Under tensor parallelism every rank holds every expert's
slice of the intermediate features (and of the shared expert's), reading only that slice of
the per-expert tensors (``shard_plan``; fused tensors are read whole and sliced here); the
routed and shared outputs are partial sums, reduced once per layer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Protocol

import torch
from torch import nn

from ferrollm.distributed.collectives import all_reduce
from ferrollm.distributed.shard_plan import ShardPlan, TensorSlice
from ferrollm.distributed.state import SINGLE, ParallelState
from ferrollm.layers.fused_moe import Expert, dispatch, select_experts
from ferrollm.layers.linear import Linear, Weight
from ferrollm.models.llama import (
    LlamaConfigLike,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
)
from ferrollm.models.llama_parallel import QUANT_GROUP, LlamaShardLayout
from ferrollm.models.moe_config import MoeParams


class MoeConfigLike(LlamaConfigLike, Protocol):
    """What the MoE families read beyond the Llama fields (``ModelConfig`` has it)."""

    @property
    def moe(self) -> MoeParams | None: ...


class SparseMoeBlock(nn.Module):
    """Router, experts and the optional shared expert of one sparse layer."""

    def __init__(self, config: MoeConfigLike, scheme: str | None, parallel: ParallelState) -> None:
        super().__init__()
        moe = _moe(config)
        hidden, act = config.hidden_size, config.hidden_act
        self.parallel = parallel
        self.top_k = moe.num_experts_per_tok
        self.renormalize = moe.renormalize
        self.gate = Linear(hidden, [("gate", moe.num_experts)], bias=False)
        size = expert_slice(moe.expert_intermediate_size, "experts", parallel, scheme).size
        self.experts = nn.ModuleList(
            Expert(hidden, size, act, scheme) for _ in range(moe.num_experts)
        )
        self.shared_expert: Expert | None = None
        self.shared_gate: Linear | None = None
        if moe.shared_expert_intermediate_size:
            full = moe.shared_expert_intermediate_size
            shared = expert_slice(full, "shared_expert", parallel, scheme).size
            self.shared_expert = Expert(hidden, shared, act, scheme)
            # Module `shared_gate`, route `mlp.shared_expert_gate`: the checkpoint's name.
            self.shared_gate = Linear(hidden, [("shared_expert_gate", 1)], bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, hidden]`` -> ``[T, hidden]`` (the same on every rank)."""
        weights, ids = select_experts(self.gate(x), self.top_k, self.renormalize)
        out = dispatch(x, weights, ids, list(self.experts))
        if self.shared_expert is not None and self.shared_gate is not None:
            out = out + torch.sigmoid(self.shared_gate(x)) * self.shared_expert(x)
        if self.parallel.world_size > 1:
            out = all_reduce(out, self.parallel)
        return out


class MoeDecoderLayer(LlamaDecoderLayer):
    """The Llama block with a sparse MLP (or the dense one on Qwen's dense layers)."""

    def __init__(
        self, config: MoeConfigLike, layer_idx: int, scheme: str | None, layout: LlamaShardLayout
    ) -> None:
        mlp: nn.Module = (
            LlamaMLP(config, scheme, layout)
            if layer_idx in _moe(config).dense_layers
            else SparseMoeBlock(config, scheme, layout.parallel)
        )
        super().__init__(config, layer_idx, scheme, layout, mlp=mlp)


#: Mixtral's on-disk names -> ours (`MoeForCausalLM.checkpoint_tensors`).
_MIXTRAL_NAMES = re.compile(r"\.block_sparse_moe\.(gate|experts\.\d+\.w[123])\.")
_MIXTRAL_PROJ = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}
_FUSED = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")


class MoeForCausalLM(LlamaForCausalLM):
    """Mixtral (``MixtralForCausalLM``), Qwen2-MoE and Qwen3-MoE over paged attention."""

    decoder_layer = MoeDecoderLayer
    #: The expert dispatch has data-dependent shapes: the decode step is not compiled.
    compilable = False

    def __init__(
        self,
        config: MoeConfigLike,
        quantization: str | None = None,
        parallel: ParallelState = SINGLE,
    ) -> None:
        super().__init__(config, quantization, parallel)
        self.config: MoeConfigLike = config
        moe = _moe(config)
        #: This rank's slices of each expert's and of the shared expert's features.
        self.expert_slice = expert_slice(
            moe.expert_intermediate_size, "experts", parallel, quantization
        )
        self.shared_slice = expert_slice(
            moe.shared_expert_intermediate_size, "shared_expert", parallel, quantization
        )

    def checkpoint_tensors(
        self, weights: Iterable[tuple[str, Weight]]
    ) -> Iterator[tuple[str, Weight]]:
        """The checkpoint's tensors under this model's per-expert names (module docstring)."""
        for name, tensor in weights:
            fused = _FUSED.match(name)
            if fused is not None:
                size = _moe(self.config).expert_intermediate_size
                yield from split_stacked_experts(name, tensor, size, self.expert_slice)
                continue
            yield _MIXTRAL_NAMES.sub(_mixtral_name, name), tensor

    def shard_plan(self) -> ShardPlan:
        """The Llama plan plus every expert's (and the shared expert's) slice, under both the
        per-expert names and Mixtral's."""
        plan = super().shard_plan()
        if self.parallel.world_size == 1:
            return plan
        slices = dict(plan.slices)
        moe = _moe(self.config)
        for i in range(self.config.num_hidden_layers):
            if i in moe.dense_layers:
                continue
            layer = f"model.layers.{i}"
            for e in range(moe.num_experts):
                slices |= expert_slices(f"{layer}.mlp.experts.{e}", self.expert_slice)
                mixtral = f"{layer}.block_sparse_moe.experts.{e}"
                slices |= expert_slices(mixtral, self.expert_slice, ("w1", "w3", "w2"))
            if moe.shared_expert_intermediate_size:
                slices |= expert_slices(f"{layer}.mlp.shared_expert", self.shared_slice)
        return ShardPlan(plan.rank, plan.world_size, slices)


def expert_slice(size: int, name: str, parallel: ParallelState, scheme: str | None) -> TensorSlice:
    """Rank ``parallel.rank``'s rows ``[start, stop)`` of ``size`` intermediate features
    (all of them alone). ValueError naming ``tensor_parallel_size`` when they cannot split,
    or when int4 blocks would straddle two ranks' down-projection columns."""
    n, r = parallel.world_size, parallel.rank
    local = size // n
    why = None
    if size % n:
        why = f"`{name}` intermediate size ({size}) must divide evenly"
    elif n > 1 and scheme in ("int4", "native") and size % QUANT_GROUP == 0 and local % QUANT_GROUP:
        why = (
            f"`{name}.down_proj`: each rank's {local} input columns are not a multiple of the "
            f"{QUANT_GROUP}-column quantization group"
        )
    if why is not None:
        raise ValueError(f"`tensor_parallel_size` {n} cannot split this model: {why}")
    return TensorSlice(0, r * local, (r + 1) * local)


def expert_slices(
    prefix: str,
    part: TensorSlice,
    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
) -> dict[str, TensorSlice]:
    """The plan entries of one gated expert under ``prefix`` (its gate, up and down names):
    rows ``part`` of gate and up, the same columns of down."""
    gate, up, down = names
    columns = TensorSlice(1, part.start, part.stop)
    return {
        f"{prefix}.{gate}.weight": part,
        f"{prefix}.{up}.weight": part,
        f"{prefix}.{down}.weight": columns,
    }


def split_stacked_experts(
    name: str, tensor: Weight, size: int, part: TensorSlice
) -> Iterator[tuple[str, Weight]]:
    """Per-expert tensors (rows or columns ``part`` of each) from a transformers 5
    ``state_dict()``'s stacked ``<prefix>.gate_up_proj [E, 2I, H]`` or ``down_proj [E, H, I]``
    (``name``), ``size`` being each expert's ``I``."""
    prefix, kind = name.rsplit(".", 1)
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 3:
        raise ValueError(f"checkpoint tensor `{name}` must be a dense 3-D tensor")
    for e, w in enumerate(tensor):
        if kind == "down_proj":
            yield f"{prefix}.{e}.down_proj.weight", w[:, part.start : part.stop]
            continue
        yield f"{prefix}.{e}.gate_proj.weight", w[:size][part.start : part.stop]
        yield f"{prefix}.{e}.up_proj.weight", w[size:][part.start : part.stop]


def _mixtral_name(match: re.Match[str]) -> str:
    what = match[1]
    if what == "gate":
        return ".mlp.gate."
    _, index, proj = what.split(".")
    return f".mlp.experts.{index}.{_MIXTRAL_PROJ[proj]}."


def _moe(config: MoeConfigLike) -> MoeParams:
    if config.moe is None:
        raise ValueError(f"config: a mixture-of-experts model needs `moe` fields; got {config!r}")
    return config.moe
