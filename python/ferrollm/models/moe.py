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
                yield from self._split_fused(fused[1], fused[2], tensor)
                continue
            yield _MIXTRAL_NAMES.sub(_mixtral_name, name), tensor

    def _split_fused(self, prefix: str, kind: str, tensor: Weight) -> Iterator[tuple[str, Weight]]:
        """One expert's gate/up/down (this rank's slice) at a time from a 3-D tensor."""
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 3:
            raise ValueError(f"checkpoint tensor `{prefix}.{kind}` must be a dense 3-D tensor")
        full = _moe(self.config).expert_intermediate_size
        part = self.expert_slice
        for e, w in enumerate(tensor):
            if kind == "down_proj":
                yield f"{prefix}.{e}.down_proj.weight", w[:, part.start : part.stop]
                continue
            gate, up = w[:full], w[full:]
            yield f"{prefix}.{e}.gate_proj.weight", gate[part.start : part.stop]
            yield f"{prefix}.{e}.up_proj.weight", up[part.start : part.stop]

    def shard_plan(self) -> ShardPlan:
        """The Llama plan plus every expert's (and the shared expert's) slice, under both the
        per-expert names and Mixtral's."""
        plan = super().shard_plan()
        if self.parallel.world_size == 1:
            return plan
        slices = dict(plan.slices)
        moe = _moe(self.config)
        rows, cols = self.expert_slice, TensorSlice(1, *_span(self.expert_slice))
        shared_rows = self.shared_slice
        shared_cols = TensorSlice(1, *_span(self.shared_slice))
        for i in range(self.config.num_hidden_layers):
            if i in moe.dense_layers:
                continue
            layer = f"model.layers.{i}"
            for e in range(moe.num_experts):
                for prefix, gate, up, down in (
                    (f"{layer}.mlp.experts.{e}", "gate_proj", "up_proj", "down_proj"),
                    (f"{layer}.block_sparse_moe.experts.{e}", "w1", "w3", "w2"),
                ):
                    slices[f"{prefix}.{gate}.weight"] = rows
                    slices[f"{prefix}.{up}.weight"] = rows
                    slices[f"{prefix}.{down}.weight"] = cols
            if moe.shared_expert_intermediate_size:
                prefix = f"{layer}.mlp.shared_expert"
                slices[f"{prefix}.gate_proj.weight"] = shared_rows
                slices[f"{prefix}.up_proj.weight"] = shared_rows
                slices[f"{prefix}.down_proj.weight"] = shared_cols
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


def _span(part: TensorSlice) -> tuple[int, int]:
    return part.start, part.stop


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
