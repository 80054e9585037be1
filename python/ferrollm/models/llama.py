"""One decoder for the Llama family: Llama 2/3, Mistral, Qwen2/2.5, Qwen3 and SmolLM2.

The families differ only in switches read from the config: grouped-query attention (fewer KV
heads), q/k/v, o_proj and MLP biases (Qwen2; Llama's ``attention_bias``/``mlp_bias``), per-head
q/k RMSNorm before RoPE (Qwen3), Llama 3 RoPE scaling, a sliding window (Mistral) and tied
input/output embeddings (SmolLM2, small Qwens). ``ModelConfig`` resolves each switch once per
architecture (including what a family implies but its config.json leaves out), so this module
holds no per-family facts and one class runs every family. Tensors are flat
``[num_tokens, ...]``: rows of a step are concatenated, and only attention knows where one row
ends (through ``AttentionContext``).

Parameter names follow Hugging Face checkpoints except that q/k/v and gate/up projections are
stored merged (``qkv_proj``, ``gate_up_proj``); ``load_weights`` takes HF names and routes them
(a family whose checkpoints store them fused, ``fused_checkpoint``, loads those tensors split).
With a ``quantization`` scheme the linear layers (the LM head too, tied or not) hold packed
weight-only kernels instead of float weights (``ferrollm.layers.linear``).

Built for a rank of a tensor-parallel group (``parallel``), the model holds only that rank's
heads, MLP features and vocabulary rows (``ferrollm.models.llama_parallel``), reads only those
slices of the checkpoint (``shard_plan``), and its forward and ``compute_logits`` are collective:
every rank calls them in the same order with the same shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ferrollm.distributed.collectives import gather_to_driver
from ferrollm.distributed.shard_plan import ShardPlan
from ferrollm.distributed.state import SINGLE, ParallelState
from ferrollm.executor.kv_cache import KVCacheSpec
from ferrollm.layers.activation import ACTIVATIONS
from ferrollm.layers.attention import AttentionContext, PagedAttention
from ferrollm.layers.gated_mlp import fused_silu_mlp
from ferrollm.layers.linear import (
    Embedding,
    Linear,
    dense_copies_pay,
)
from ferrollm.layers.norm import RMSNorm
from ferrollm.layers.parallel import RowParallelLinear, VocabParallelEmbedding
from ferrollm.layers.rotary import RotaryEmbedding, apply_rotary
from ferrollm.models.checkpoint import HfCheckpointModel
from ferrollm.models.llama_parallel import LlamaShardLayout

if TYPE_CHECKING:
    from ferrollm.executor.step_extras import EmbeddingOverride


class LlamaConfigLike(Protocol):
    """The config fields this model reads (``ferrollm.models.config.ModelConfig`` has them)."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def num_hidden_layers(self) -> int: ...
    @property
    def num_attention_heads(self) -> int: ...
    @property
    def num_key_value_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def rms_norm_eps(self) -> float: ...
    @property
    def rope_theta(self) -> float: ...
    @property
    def rope_scaling(self) -> Mapping[str, Any] | None: ...
    @property
    def tie_word_embeddings(self) -> bool: ...
    @property
    def attention_bias(self) -> bool: ...
    @property
    def o_proj_bias(self) -> bool: ...
    @property
    def mlp_bias(self) -> bool: ...
    @property
    def qk_norm(self) -> bool: ...
    @property
    def sliding_window(self) -> int | None: ...
    @property
    def hidden_act(self) -> str: ...


class LlamaAttention(nn.Module):
    """Self-attention with GQA, optional q/k/v and o_proj biases and optional q/k norm.

    Other families set the q/k norm's class (``norm``), the score ``scale`` (default
    ``head_dim ** -0.5``), a ``window`` of this layer's own and a ``softcap`` on its scores
    (see ``PagedAttention``) and the
    ``rotary`` function that applies the step's cos/sin (GLM's partial interleaved rope).
    """

    def __init__(
        self,
        config: LlamaConfigLike,
        layer_idx: int,
        scheme: str | None,
        layout: LlamaShardLayout,
        *,
        norm: type[RMSNorm] = RMSNorm,
        scale: float | None = None,
        window: int | None = None,
        softcap: float | None = None,
        rotary: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = apply_rotary,
    ) -> None:
        super().__init__()
        self.rotary = rotary
        self.num_heads = layout.num_heads
        self.num_kv_heads = layout.num_kv_heads
        self.head_dim = config.head_dim
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        self.qk_v_sizes = [q_size + kv_size, kv_size]
        shards = [("q_proj", q_size), ("k_proj", kv_size), ("v_proj", kv_size)]
        self.qkv_proj = Linear(
            config.hidden_size, shards, bias=config.attention_bias, scheme=scheme
        )
        self.o_proj = row_linear(
            q_size, "o_proj", config.hidden_size, config.o_proj_bias, scheme, layout
        )
        qk_norm = config.qk_norm
        self.q_norm = norm(self.head_dim, config.rms_norm_eps) if qk_norm else None
        self.k_norm = norm(self.head_dim, config.rms_norm_eps) if qk_norm else None
        self.attn = PagedAttention(layer_idx, scale or self.head_dim**-0.5, window, softcap)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        """``x [T, hidden]`` -> ``[T, hidden]``."""
        num_tokens = x.shape[0]
        qk, v = self.qkv_proj(x).split(self.qk_v_sizes, dim=-1)
        qk = qk.view(num_tokens, self.num_heads + self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
            qk = torch.cat((self.q_norm(q), self.k_norm(k)), dim=1)
        # One rotation for q and k together: half the elementwise ops of rotating each.
        q, k = torch.split(self.rotary(qk, cos, sin), [self.num_heads, self.num_kv_heads], dim=1)
        o = self.attn(q, k, v, ctx)
        out: torch.Tensor = self.o_proj(o.reshape(num_tokens, -1))
        return out


class LlamaMLP(nn.Module):
    """Gated feed-forward: ``down(act(gate(x)) * up(x))``; SwiGLU (``act`` = SiLU) in Llama,
    GeGLU (tanh-approximated GELU) in Gemma."""

    def __init__(
        self, config: LlamaConfigLike, scheme: str | None, layout: LlamaShardLayout
    ) -> None:
        super().__init__()
        size = layout.intermediate_size
        shards = [("gate_proj", size), ("up_proj", size)]
        bias = config.mlp_bias
        self.gate_up_proj = Linear(config.hidden_size, shards, bias=bias, scheme=scheme)
        self.down_proj = row_linear(size, "down_proj", config.hidden_size, bias, scheme, layout)
        self.act = ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, hidden]`` -> ``[T, hidden]``."""
        fused = fused_silu_mlp(self.gate_up_proj, self.down_proj, self.act, x)
        if fused is not None:
            return fused
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        out: torch.Tensor = self.down_proj(self.act(gate) * up)
        return out


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks, each with a residual connection; a family may give
    its own ``attention`` or ``mlp`` block (GLM's rope, a mixture of experts)."""

    def __init__(
        self,
        config: LlamaConfigLike,
        layer_idx: int,
        scheme: str | None,
        layout: LlamaShardLayout,
        *,
        attention: nn.Module | None = None,
        mlp: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.self_attn = attention or LlamaAttention(config, layer_idx, scheme, layout)
        self.mlp = mlp or LlamaMLP(config, scheme, layout)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        """One transformer block over ``h [T, hidden]``."""
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, ctx)
        out: torch.Tensor = h + self.mlp(self.post_attention_layernorm(h))
        return out


#: Builds decoder layer ``layer_idx`` of a family: ``(config, layer_idx, scheme, layout)``.
DecoderLayerFactory = Callable[[Any, int, "str | None", LlamaShardLayout], nn.Module]


class LlamaModel(nn.Module):
    """Embeddings, decoder layers and the final norm (HF's ``model.`` prefix); a family
    gives its own decoder layer and norm classes."""

    def __init__(
        self,
        config: LlamaConfigLike,
        scheme: str | None,
        layout: LlamaShardLayout,
        layer: DecoderLayerFactory = LlamaDecoderLayer,
        norm: type[RMSNorm] = RMSNorm,
    ) -> None:
        super().__init__()
        quantized_table = scheme is not None
        parallel = layout.parallel
        self.embed_tokens: Embedding = (
            Embedding(config.vocab_size, config.hidden_size, quantized=quantized_table)
            if parallel.world_size == 1
            else VocabParallelEmbedding(
                layout.num_vocab_rows,
                config.hidden_size,
                quantized=quantized_table,
                start=layout.vocab[0],
                parallel=parallel,
            )
        )
        self.layers = nn.ModuleList(
            layer(config, i, scheme, layout) for i in range(config.num_hidden_layers)
        )
        self.norm = norm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(HfCheckpointModel):
    """The Llama-family causal LM over paged attention.

    ``forward(input_ids, positions, ctx)`` returns final hidden states ``[T, hidden]``;
    ``compute_logits`` projects only the rows that are sampled. The Llama-shaped
    architectures run on this class, what differs read from ``config``; another family
    subclasses it with its own ``decoder_layer`` and ``norm`` (``ferrollm.models.gemma``).
    """

    decoder_layer: DecoderLayerFactory = LlamaDecoderLayer
    norm: type[RMSNorm] = RMSNorm
    config: LlamaConfigLike
    model: LlamaModel

    def __init__(
        self,
        config: LlamaConfigLike,
        quantization: str | None = None,
        parallel: ParallelState = SINGLE,
    ) -> None:
        super().__init__()
        self.config = config
        #: The linear layers' scheme (see ``ferrollm.layers.linear.Linear``); None = dense.
        self.quantization = quantization
        #: This rank's share of the model (all of it when ``parallel`` is ``SINGLE``).
        self.layout = LlamaShardLayout.build(config, parallel, quantization)
        self.parallel = parallel
        self.model = LlamaModel(
            config, quantization, self.layout, type(self).decoder_layer, type(self).norm
        )
        # A dense tied head reads the embedding table itself; a quantized one packs its own
        # copy of it (the head is a fifth of a small model's weights: worth the kernel).
        tied_dense = config.tie_word_embeddings and quantization is None
        self.lm_head = (
            None
            if tied_dense
            else Linear(
                config.hidden_size,
                [("lm_head", self.layout.num_vocab_rows)],
                bias=False,
                scheme=quantization,
            )
        )
        self.rotary = self.build_rotary(config)
        #: Mistral-style uniform sliding window (keys within the last ``w`` positions), or None.
        self.sliding_window = config.sliding_window
        #: Other windows some layers use instead (none here; see ``CausalLM.layer_windows``).
        self.layer_windows: tuple[int, ...] = ()
        #: The cap on attention scores (none here; see ``CausalLM.attention_softcap``).
        self.attention_softcap: float | None = None
        #: How this rank splits fused checkpoint tensors, by layer suffix.
        self.fused_parts = self.layout.fused_parts(config)

    def build_rotary(self, config: Any) -> RotaryEmbedding:
        """The rope every layer shares (a family turning part of each head overrides it)."""
        return RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)

    @property
    def vocab_size(self) -> int:
        """Rows of the output projection (the whole vocabulary, on every rank)."""
        return self.config.vocab_size

    @property
    def num_local_kv_heads(self) -> int:
        """KV heads this rank keeps in its KV cache."""
        return self.layout.num_kv_heads

    def kv_cache_spec(self, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
        """The paged KV cache this rank's layers read and write: K and V of every local KV
        head (a family with another cache layout overrides it: ``ferrollm.models.deepseek``)."""
        return KVCacheSpec(
            self.config.num_hidden_layers,
            self.num_local_kv_heads,
            self.config.head_dim,
            block_size,
            dtype,
        )

    def set_max_model_len(self, max_model_len: int) -> None:
        """The longest sequence the engine will run, known once its KV cache is sized: long
        rope picks its factors from it (``ferrollm.layers.rotary``). Call before compiling."""
        self.rotary.set_max_model_len(max_model_len)

    def shard_plan(self) -> ShardPlan:
        """The slices of the checkpoint this rank reads (``ModelSource.iter_weights``)."""
        return self.layout.plan(self.config.num_hidden_layers, self.config.tie_word_embeddings)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        embeds: EmbeddingOverride | None = None,
    ) -> torch.Tensor:
        """Final hidden states ``[T, hidden]`` of the step's tokens ``input_ids [T]``;
        ``embeds`` gives some tokens' input embeddings instead (p-tuning's virtual ids,
        which lie past the embedding matrix)."""
        h = self.embed(input_ids, embeds)
        cos, sin = self.rotary.cos_sin(positions, h.dtype)
        for layer in self.model.layers:
            h = layer(h, cos, sin, ctx)
        return self.model.norm(h)  # type: ignore[no-any-return]

    def embed(
        self, input_ids: torch.Tensor, embeds: EmbeddingOverride | None = None
    ) -> torch.Tensor:
        """The input embeddings ``[T, hidden]`` of ``input_ids``, ``embeds`` replacing some."""
        h: torch.Tensor
        if embeds is None:
            h = self.model.embed_tokens(input_ids)
            return h
        h = self.model.embed_tokens(input_ids.clamp(max=self.vocab_size - 1))
        return h.index_copy(0, embeds.token_indices, embeds.rows.to(h.dtype))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``[rows, vocab]`` (model dtype) for hidden states ``[rows, hidden]``.

        Sharded, it is collective and the full logits land on rank 0 only; another rank gets
        its own vocabulary rows' logits back (padding included), to ignore."""
        if self.lm_head is None:
            logits = F.linear(hidden, self.model.embed_tokens.weight)  # type: ignore[arg-type]
        else:
            logits = self.lm_head(hidden)
        if self.parallel.world_size == 1:
            return logits
        logits = gather_to_driver(logits, self.parallel)
        return logits[:, : self.vocab_size] if self.parallel.is_driver else logits

    def set_compute_dtype(self, dtype: torch.dtype, dense_copy_budget: int = 0) -> None:
        """The activations' dtype; quantized layers also keep a dense copy for many-row calls
        where that pays (`dense_copies_pay`) and all the copies fit in ``dense_copy_budget``
        bytes (see ``QUANTIZED_MAX_ROWS``). Call before loading."""
        layers = [m for m in self.modules() if isinstance(m, Linear)]
        copies = sum(m.out_features * m.in_features for m in layers if m.scheme is not None)
        size = copies * torch.empty((), dtype=dtype).element_size()
        keep_dense = dense_copies_pay(dtype) and 0 < size <= dense_copy_budget
        for module in self.modules():
            if isinstance(module, (Linear, Embedding)):
                module.compute_dtype = dtype
            if isinstance(module, Linear):
                module.keep_dense = keep_dense


def row_linear(
    in_features: int,
    name: str,
    out_features: int,
    bias: bool,
    scheme: str | None,
    layout: LlamaShardLayout,
) -> Linear:
    """o_proj / down_proj: a plain `Linear` alone, row-parallel in a group."""
    if layout.parallel.world_size == 1:
        return Linear(in_features, [(name, out_features)], bias=bias, scheme=scheme)
    return RowParallelLinear(
        in_features, [(name, out_features)], bias=bias, scheme=scheme, parallel=layout.parallel
    )
