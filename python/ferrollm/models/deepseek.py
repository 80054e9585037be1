"""DeepSeek-V2 and V3: multi-head latent attention over a latent KV cache, and grouped experts.

**Latent attention (MLA), absorbed.** A token's keys and values are all projected from one
compressed latent ``c = norm(kv_a(x))[:kv_lora_rank]`` (``kv_b_proj`` maps it to every head's
``k_nope`` and ``v``) plus one rotated key ``k_pe`` shared by the heads. Folding ``kv_b_proj``
into the query and the output makes the latent itself the one KV head of a multi-query
attention, so the cache holds ``[c, k_pe]`` (``kv_lora_rank + qk_rope_head_dim`` values per
token and layer) and never a per-head key or value:

* score: ``q_nope . (W_UK[h] c) + q_pe . k_pe = (q_nope W_UK[h]) . c + q_pe . k_pe``, so head
  ``h``'s query is ``[q_nope @ W_UK[h], q_pe]`` against the cache row ``[c, k_pe]``;
* value: ``sum_j p_j W_UV[h] c_j = W_UV[h] (sum_j p_j c_j)``, so attention runs with the cache
  row as its value too (``KVCacheSpec.values_are_keys``: one tensor is both caches), and each
  head's output is the first ``kv_lora_rank`` features of the result times ``W_UV[h]``.

The softmax scale is ``(qk_nope_head_dim + qk_rope_head_dim) ** -0.5``, times YaRN's
``mscale(factor, mscale_all_dim) ** 2`` under YaRN scaling (as transformers); rope turns
adjacent pairs (V2; V3 unless ``rope_interleave`` is false) and YaRN also scales cos/sin.
``kv_b_proj`` stays dense under a ``quantization`` scheme: the absorption reads its weights.

**Experts.** Layers from ``first_k_dense_replace`` on route each token to ``num_experts_per_tok``
experts (``ferrollm.layers.fused_moe.select_grouped_experts``: V2's softmax, V3's sigmoid with
its correction bias; ``ferrollm.models.deepseek_config``) and add an ungated shared MLP of
``n_shared_experts * moe_intermediate_size`` features. Checkpoints name experts per expert
(``mlp.experts.N.gate_proj`` ...) or, from a transformers 5 ``state_dict()``, stack them as
``mlp.experts.gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``; both load. V3's
multi-token-prediction layers (past ``num_hidden_layers``) are not run and not loaded.
llama.cpp's "deepseek2" GGUF files load too, renamed to these names and their split
``kv_b_proj`` joined again (``ferrollm.executor.gguf_deepseek``).

**Tensor parallelism.** Rank ``r`` keeps its share of the query heads: their rows of
``q_proj`` / ``q_b_proj`` and of ``kv_b_proj`` (each head's W_UK and W_UV), their columns of
``o_proj`` (row-parallel, one all-reduce). The latent projections (``q_a_proj``,
``kv_a_proj_with_mqa``) and their norms are small and shared by every head, so every rank
holds them whole, and every rank caches the same latent rows: the latent cache is not split
(per-token cache bytes are the same at any ``tensor_parallel_size``). Routed and shared experts
split their intermediate features as in ``ferrollm.models.moe``: one all-reduce per sparse layer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ferrollm.distributed.collectives import all_reduce
from ferrollm.distributed.shard_plan import ShardPlan, TensorSlice
from ferrollm.distributed.state import SINGLE, ParallelState
from ferrollm.executor.kv_cache import KVCacheSpec
from ferrollm.layers.attention import AttentionContext, PagedAttention
from ferrollm.layers.fused_moe import Expert, dispatch, select_grouped_experts
from ferrollm.layers.linear import Linear, Weight
from ferrollm.layers.norm import RMSNorm
from ferrollm.layers.rotary import RotaryEmbedding, apply_interleaved_rotary, apply_rotary
from ferrollm.models.config import yarn_mscale
from ferrollm.models.deepseek_config import DeepseekMoeParams, MlaParams
from ferrollm.models.llama import (
    LlamaConfigLike,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    row_linear,
)
from ferrollm.models.llama_parallel import INT4_ROW_MULTIPLE, QUANT_GROUP, LlamaShardLayout
from ferrollm.models.moe import expert_slice, expert_slices, split_stacked_experts

#: The eps of the q and kv latents' norms: transformers' default, which no config overrides.
LATENT_NORM_EPS = 1e-6


class DeepseekConfigLike(LlamaConfigLike, Protocol):
    """What DeepSeek reads beyond the Llama fields (``ModelConfig`` has it)."""

    @property
    def mla(self) -> MlaParams | None: ...
    @property
    def deepseek_moe(self) -> DeepseekMoeParams | None: ...


class MlaAttention(nn.Module):
    """Multi-head latent attention in the absorbed form (module docstring)."""

    def __init__(
        self,
        config: DeepseekConfigLike,
        layer_idx: int,
        scheme: str | None,
        layout: LlamaShardLayout,
    ) -> None:
        super().__init__()
        mla = _mla(config)
        heads = self.num_heads = layout.num_heads  # this rank's query heads
        self.nope, self.rope, self.rank = (
            mla.qk_nope_head_dim,
            mla.qk_rope_head_dim,
            mla.kv_lora_rank,
        )
        self.v_head_dim = mla.v_head_dim
        hidden, bias = config.hidden_size, config.attention_bias
        q_size = heads * (self.nope + self.rope)
        self.q_proj: Linear | None = None
        self.q_a_proj: Linear | None = None
        self.q_a_layernorm: RMSNorm | None = None
        self.q_b_proj: Linear | None = None
        if mla.q_lora_rank is None:
            self.q_proj = Linear(hidden, [("q_proj", q_size)], bias=False, scheme=scheme)
        else:
            self.q_a_proj = Linear(
                hidden, [("q_a_proj", mla.q_lora_rank)], bias=bias, scheme=scheme
            )
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = Linear(
                mla.q_lora_rank, [("q_b_proj", q_size)], bias=False, scheme=scheme
            )
        self.kv_a_proj_with_mqa = Linear(
            hidden, [("kv_a_proj_with_mqa", mla.cache_head_dim)], bias=bias, scheme=scheme
        )
        self.kv_a_layernorm = RMSNorm(self.rank, LATENT_NORM_EPS)
        # Dense whatever the scheme: W_UK and W_UV are read out of it (module docstring).
        self.kv_b_proj = Linear(
            self.rank, [("kv_b_proj", heads * (self.nope + self.v_head_dim))], bias=False
        )
        self.o_proj = row_linear(
            heads * self.v_head_dim, "o_proj", hidden, config.o_proj_bias, scheme, layout
        )
        self.rotary = apply_interleaved_rotary if mla.rope_interleave else apply_rotary
        self.attn = PagedAttention(layer_idx, mla_softmax_scale(config))

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        """``x [T, hidden]`` -> ``[T, hidden]``; writes ``[c, k_pe]`` of each token to the cache."""
        num_tokens = x.shape[0]
        q_nope, q_pe = torch.split(self._query(x), [self.nope, self.rope], dim=-1)
        latent, k_pe = torch.split(self.kv_a_proj_with_mqa(x), [self.rank, self.rope], dim=-1)
        latent = self.kv_a_layernorm(latent).view(num_tokens, 1, self.rank)
        q_pe = self.rotary(q_pe, cos, sin)
        k_pe = self.rotary(k_pe.reshape(num_tokens, 1, self.rope), cos, sin)
        w_uk, w_uv = self._absorbed()
        q = torch.cat((torch.einsum("thn,hnr->thr", q_nope, w_uk), q_pe), dim=-1)
        kv = torch.cat((latent, k_pe), dim=-1)  # the cache row: one head, both key and value
        o = self.attn(q, kv, kv, ctx)[..., : self.rank]
        o = torch.einsum("thr,hvr->thv", o, w_uv)
        out: torch.Tensor = self.o_proj(o.reshape(num_tokens, -1))
        return out

    def _absorbed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``W_UK [heads, qk_nope_head_dim, rank]`` and ``W_UV [heads, v_head_dim, rank]``:
        views of ``kv_b_proj``'s weight, whose rows are each head's k_nope then v."""
        weight = self.kv_b_proj.weight
        assert weight is not None  # dense: built without a scheme
        w_kv = weight.view(self.num_heads, self.nope + self.v_head_dim, self.rank)
        return torch.split(w_kv, [self.nope, self.v_head_dim], dim=1)  # type: ignore[return-value]

    def _query(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, heads, qk_nope_head_dim + qk_rope_head_dim]``."""
        q: torch.Tensor
        if self.q_proj is not None:
            q = self.q_proj(x)
        else:
            assert self.q_a_proj and self.q_a_layernorm and self.q_b_proj  # set together
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        return q.view(x.shape[0], self.num_heads, self.nope + self.rope)


def mla_softmax_scale(config: DeepseekConfigLike) -> float:
    """``qk_head_dim ** -0.5``, times ``mscale(factor, mscale_all_dim) ** 2`` under YaRN."""
    mla = _mla(config)
    scale: float = (mla.qk_nope_head_dim + mla.qk_rope_head_dim) ** -0.5
    scaling = config.rope_scaling
    if scaling is not None and scaling.get("mscale_all_dim"):
        mscale = yarn_mscale(float(scaling["factor"]), float(scaling["mscale_all_dim"]))
        scale *= mscale * mscale
    return scale


class DeepseekRouter(nn.Module):
    """The router (``mlp.gate``): its weight and V3's ``e_score_correction_bias``, kept dense
    and applied in float32 as transformers does."""

    def __init__(self, hidden_size: int, moe: DeepseekMoeParams) -> None:
        super().__init__()
        self.moe = moe
        self.weight = nn.Parameter(torch.empty(moe.num_experts, hidden_size), requires_grad=False)
        self.e_score_correction_bias = (
            nn.Parameter(torch.zeros(moe.num_experts), requires_grad=False)
            if moe.scoring_func == "sigmoid"
            else None
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights [T, k] float32, expert ids [T, k])`` for ``x [T, hidden]``."""
        moe = self.moe
        return select_grouped_experts(
            F.linear(x.float(), self.weight.float()),
            moe.num_experts_per_tok,
            scoring_func=moe.scoring_func,
            num_groups=moe.num_groups,
            topk_groups=moe.topk_groups,
            renormalize=moe.renormalize,
            scaling_factor=moe.routed_scaling_factor,
            correction_bias=self.e_score_correction_bias,
        )


class DeepseekMoe(nn.Module):
    """Routed experts plus the ungated shared experts of one sparse layer (this rank's
    slice of each one's features under tensor parallelism)."""

    def __init__(
        self, config: DeepseekConfigLike, scheme: str | None, parallel: ParallelState
    ) -> None:
        super().__init__()
        moe = _moe(config)
        hidden, act = config.hidden_size, config.hidden_act
        self.parallel = parallel
        self.gate = DeepseekRouter(hidden, moe)
        size = expert_slice(moe.expert_intermediate_size, "experts", parallel, scheme).size
        self.experts = nn.ModuleList(
            Expert(hidden, size, act, scheme) for _ in range(moe.num_experts)
        )
        shared = moe.expert_intermediate_size * moe.num_shared_experts
        self.shared_experts = (
            Expert(
                hidden, expert_slice(shared, "shared_experts", parallel, scheme).size, act, scheme
            )
            if shared
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, hidden]`` -> ``[T, hidden]``."""
        weights, ids = self.gate(x)
        out = dispatch(x, weights, ids, list(self.experts))
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        if self.parallel.world_size > 1:
            out = all_reduce(out, self.parallel)
        return out


class DeepseekDecoderLayer(LlamaDecoderLayer):
    """Llama's pre-norm block with latent attention and, past the dense layers, experts."""

    def __init__(
        self,
        config: DeepseekConfigLike,
        layer_idx: int,
        scheme: str | None,
        layout: LlamaShardLayout,
    ) -> None:
        attention = MlaAttention(config, layer_idx, scheme, layout)
        dense = layer_idx < _moe(config).first_k_dense_replace
        mlp = (
            LlamaMLP(config, scheme, layout)
            if dense
            else DeepseekMoe(config, scheme, layout.parallel)
        )
        super().__init__(config, layer_idx, scheme, layout, attention=attention, mlp=mlp)


_FUSED = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class DeepseekForCausalLM(LlamaForCausalLM):
    """DeepSeek-V2 (``DeepseekV2ForCausalLM``) and V3 (``DeepseekV3ForCausalLM``)."""

    decoder_layer = DeepseekDecoderLayer
    #: The expert dispatch has data-dependent shapes, and one cache tensor is both K and V.
    compilable = False

    def __init__(
        self,
        config: DeepseekConfigLike,
        quantization: str | None = None,
        parallel: ParallelState = SINGLE,
    ) -> None:
        super().__init__(config, quantization, parallel)
        self.config: DeepseekConfigLike = config
        moe = _moe(config)
        #: This rank's slices of each routed expert's and of the shared experts' features.
        self.expert_slice = expert_slice(
            moe.expert_intermediate_size, "experts", parallel, quantization
        )
        self.shared_slice = expert_slice(
            moe.expert_intermediate_size * moe.num_shared_experts,
            "shared_experts",
            parallel,
            quantization,
        )
        if parallel.world_size > 1 and quantization in ("int4", "native"):
            _check_int4_split(config, self.layout)

    def build_rotary(self, config: DeepseekConfigLike) -> RotaryEmbedding:
        """Rope over the ``qk_rope_head_dim`` features of the query heads and shared key."""
        mla = _mla(config)
        return RotaryEmbedding(
            mla.qk_rope_head_dim,
            config.rope_theta,
            config.rope_scaling,
            interleaved=mla.rope_interleave,
        )

    @property
    def num_local_kv_heads(self) -> int:
        """One: the latent is the only "head" the cache holds."""
        return 1

    def kv_cache_spec(self, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
        """One ``[c, k_pe]`` row per token and layer, serving as key and value."""
        return KVCacheSpec(
            self.config.num_hidden_layers,
            1,
            _mla(self.config).cache_head_dim,
            block_size,
            dtype,
            values_are_keys=True,
        )

    def checkpoint_tensors(
        self, weights: Iterable[tuple[str, Weight]]
    ) -> Iterator[tuple[str, Weight]]:
        """Stacked experts split per expert (module docstring); other names as they are."""
        size = _moe(self.config).expert_intermediate_size
        for name, tensor in weights:
            if _FUSED.match(name) is None:
                yield name, tensor
            else:
                yield from split_stacked_experts(name, tensor, size, self.expert_slice)

    def shard_plan(self) -> ShardPlan:
        """Each rank's query heads of the attention projections and its features of every
        expert (module docstring); the dense layers' MLP and the vocabulary as Llama's."""
        plan = super().shard_plan()
        if self.parallel.world_size == 1:
            return plan
        slices = dict(plan.slices)
        mla, moe = _mla(self.config), _moe(self.config)
        first, last = self.layout.heads
        qk, kv_b = (
            mla.qk_nope_head_dim + mla.qk_rope_head_dim,
            mla.qk_nope_head_dim + mla.v_head_dim,
        )
        for i in range(self.config.num_hidden_layers):
            attn = f"model.layers.{i}.self_attn"
            query = TensorSlice(0, first * qk, last * qk)
            slices[f"{attn}.q_proj.weight"] = slices[f"{attn}.q_b_proj.weight"] = query
            slices[f"{attn}.kv_b_proj.weight"] = TensorSlice(0, first * kv_b, last * kv_b)
            v = mla.v_head_dim
            slices[f"{attn}.o_proj.weight"] = TensorSlice(1, first * v, last * v)
            if i < moe.first_k_dense_replace:
                continue
            mlp = f"model.layers.{i}.mlp"
            for e in range(moe.num_experts):
                slices |= expert_slices(f"{mlp}.experts.{e}", self.expert_slice)
            if moe.num_shared_experts:
                slices |= expert_slices(f"{mlp}.shared_experts", self.shared_slice)
        return ShardPlan(plan.rank, plan.world_size, slices)

    def _ignored(self, name: str) -> bool:
        # V3's multi-token-prediction layers follow the decoder's in its checkpoints.
        layer = _LAYER.match(name)
        if layer is not None and int(layer[1]) >= self.config.num_hidden_layers:
            return True
        return super()._ignored(name)


def _check_int4_split(config: DeepseekConfigLike, layout: LlamaShardLayout) -> None:
    """The int4 kernel packs output rows in 16s and input columns in 32-column groups: each
    rank's query rows and ``o_proj`` columns must fall on those (``kv_b_proj`` is dense)."""
    mla, n = _mla(config), layout.parallel.world_size
    heads = config.num_attention_heads
    checks = (
        (
            "q_b_proj" if mla.q_lora_rank else "q_proj",
            "output rows",
            INT4_ROW_MULTIPLE,
            mla.qk_nope_head_dim + mla.qk_rope_head_dim,
        ),
        ("o_proj", "input columns", QUANT_GROUP, mla.v_head_dim),
    )
    for name, what, multiple, per_head in checks:
        full, local = heads * per_head, layout.num_heads * per_head
        if full % multiple == 0 and local % multiple:
            raise ValueError(
                f"`tensor_parallel_size` {n} cannot split this model: `self_attn.{name}`: each "
                f"rank's {local} {what} are not a multiple of {multiple}, which int4 packs"
            )


def _mla(config: DeepseekConfigLike) -> MlaParams:
    if config.mla is None:
        raise ValueError(f"config: latent attention needs `mla` fields; got {config!r}")
    return config.mla


def _moe(config: DeepseekConfigLike) -> DeepseekMoeParams:
    if config.deepseek_moe is None:
        raise ValueError(f"config: DeepSeek needs `deepseek_moe` fields; got {config!r}")
    return config.deepseek_moe
