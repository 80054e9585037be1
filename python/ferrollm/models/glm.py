"""GLM-4 and ChatGLM3: the Llama decoder with GLM's rope, fused checkpoint tensors and norms.

What sets GLM apart from ``ferrollm.models.llama`` (the config side is in
``ferrollm.models.glm_config``):

* rope rotates only the first ``partial_rotary_factor`` (0.5) of each head's features, in
  adjacent pairs (GPT-J's interleaved layout, not Llama's two halves); the rest pass unrotated;
* q/k/v carry biases, o_proj none;
* transformers' GLM checkpoints store gate and up as one ``gate_up_proj``; the original ChatGLM3
  / GLM-4 checkpoints fuse q/k/v too (``query_key_value``) under Megatron-style names
  (``transformer.encoder.layers.N.self_attention.dense`` ...). A fused tensor is split into the
  Llama projections it holds as it loads. Sharded, it is read whole (a rank's rows of it are not
  one range) and each rank keeps its own rows of every part; the other tensors are read as the
  Llama layout plans. (llama.cpp's "chatglm" GGUF files load here as ``GlmForCausalLM``: the
  loader splits their fused q/k/v itself, ``ferrollm.executor.gguf_chatglm``);
* Glm4 (GLM-4-0414) also norms each block's output (``post_self_attn_layernorm``,
  ``post_mlp_layernorm``) before its residual.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from ferrollm.distributed.shard_plan import ShardPlan
from ferrollm.distributed.state import SINGLE, ParallelState
from ferrollm.layers.attention import AttentionContext
from ferrollm.layers.linear import Linear, Weight
from ferrollm.layers.norm import RMSNorm
from ferrollm.layers.rotary import RotaryEmbedding, apply_interleaved_rotary
from ferrollm.models.llama import (
    LlamaAttention,
    LlamaConfigLike,
    LlamaDecoderLayer,
    LlamaForCausalLM,
)
from ferrollm.models.llama_parallel import LlamaShardLayout

#: ChatGLM's tensor names -> transformers GLM's: substring replacements, applied in order.
_CHATGLM_NAMES = (
    ("transformer.embedding.word_embeddings.", "model.embed_tokens."),
    ("transformer.encoder.final_layernorm.", "model.norm."),
    ("transformer.output_layer.", "lm_head."),
    ("transformer.encoder.layers.", "model.layers."),
    (".self_attention.query_key_value.", ".self_attn.qkv_proj."),
    (".self_attention.dense.", ".self_attn.o_proj."),
    (".mlp.dense_h_to_4h.", ".mlp.gate_up_proj."),
    (".mlp.dense_4h_to_h.", ".mlp.down_proj."),
)


class GlmConfigLike(LlamaConfigLike, Protocol):
    """What GLM reads beyond the Llama fields (``ModelConfig`` has it)."""

    @property
    def partial_rotary_factor(self) -> float: ...


class GlmDecoderLayer(LlamaDecoderLayer):
    """Llama's block with GLM's rope (GLM-4, ChatGLM3)."""

    def __init__(
        self, config: GlmConfigLike, layer_idx: int, scheme: str | None, layout: LlamaShardLayout
    ) -> None:
        attention = LlamaAttention(
            config, layer_idx, scheme, layout, rotary=apply_interleaved_rotary
        )
        super().__init__(config, layer_idx, scheme, layout, attention=attention)


class Glm4DecoderLayer(GlmDecoderLayer):
    """GLM's block with each block's output normed too, before its residual (Glm4)."""

    def __init__(
        self, config: GlmConfigLike, layer_idx: int, scheme: str | None, layout: LlamaShardLayout
    ) -> None:
        super().__init__(config, layer_idx, scheme, layout)
        self.post_self_attn_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_mlp_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        """One block over ``h [T, hidden]``."""
        attended = self.self_attn(self.input_layernorm(h), cos, sin, ctx)
        h = h + self.post_self_attn_layernorm(attended)
        out: torch.Tensor = h + self.post_mlp_layernorm(self.mlp(self.post_attention_layernorm(h)))
        return out


class GlmForCausalLM(LlamaForCausalLM):
    """GLM-4 (``GlmForCausalLM``) over paged attention, loading transformers' tensor names."""

    decoder_layer = GlmDecoderLayer
    fused_checkpoint = frozenset(["gate_up_proj"])
    #: Checkpoint name -> transformers GLM name replacements (none: these are its names).
    renames: tuple[tuple[str, str], ...] = ()

    def __init__(
        self,
        config: GlmConfigLike,
        quantization: str | None = None,
        parallel: ParallelState = SINGLE,
    ) -> None:
        super().__init__(config, quantization, parallel)
        self.config: GlmConfigLike = config
        rotary_dim = int(config.head_dim * config.partial_rotary_factor)
        if rotary_dim % 2 or rotary_dim == 0:
            raise ValueError(
                f"`partial_rotary_factor` {config.partial_rotary_factor} of `head_dim` "
                f"{config.head_dim} rotates {rotary_dim} features; rope needs an even number"
            )
        self.rotary = RotaryEmbedding(
            config.head_dim,
            config.rope_theta,
            config.rope_scaling,
            rotary_dim=rotary_dim,
            interleaved=True,
        )

    def shard_plan(self) -> ShardPlan:
        """The Llama layout's slices under this checkpoint's names (fused tensors, which no
        slice names, are read whole and split by ``Linear.load_fused``)."""
        plan = super().shard_plan()
        slices = {self.checkpoint_name(name): part for name, part in plan.slices.items()}
        return ShardPlan(plan.rank, plan.world_size, slices)

    def checkpoint_names(self) -> list[str]:
        """The tensor names a checkpoint of this model must provide, in its own dialect."""
        return [self.checkpoint_name(name) for name in super().checkpoint_names()]

    def checkpoint_name(self, name: str) -> str:
        """The checkpoint's name for our transformers-GLM-named tensor ``name``."""
        for theirs, ours in reversed(self.renames):
            name = name.replace(ours, theirs)
        return name

    def _ignored(self, name: str) -> bool:
        return super()._ignored(name) or name.endswith("rotary_pos_emb.inv_freq")

    def _load_one(
        self,
        routes: dict[str, tuple[Linear, str | None]],
        params: dict[str, nn.Parameter],
        name: str,
        tensor: Weight,
    ) -> None:
        for theirs, ours in self.renames:
            name = name.replace(theirs, ours)
        super()._load_one(routes, params, name, tensor)


class Glm4ForCausalLM(GlmForCausalLM):
    """GLM-4-0414 (``Glm4ForCausalLM``): GLM with each block's output normed."""

    decoder_layer = Glm4DecoderLayer


class ChatGlmForCausalLM(GlmForCausalLM):
    """ChatGLM3 / GLM-4 original checkpoints (``ChatGLMModel``): GLM under Megatron-style
    names, q/k/v fused as ``query_key_value`` and gate/up as ``dense_h_to_4h``."""

    fused_checkpoint = frozenset(["qkv_proj", "gate_up_proj"])
    renames = _CHATGLM_NAMES
