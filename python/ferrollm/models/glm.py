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
  Llama layout plans;
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
from ferrollm.layers.rotary import RotaryEmbedding
from ferrollm.models.llama import LlamaAttention, LlamaConfigLike, LlamaForCausalLM, LlamaMLP
from ferrollm.models.llama_parallel import LlamaShardLayout

#: Projections a checkpoint may store as one tensor -> the projections it holds, in row order.
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}

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


class InterleavedRotaryEmbedding(RotaryEmbedding):
    """Cos/sin tables over the rotated features only, each angle repeated for its pair of
    adjacent features: ``[num_tokens, rotary_dim]`` (``apply_interleaved_rotary``)."""

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)``, each ``[num_tokens, rotary_dim]`` in ``dtype``."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions[:, None].float() * self.inv_freq
        emb = freqs.repeat_interleave(2, dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_interleaved_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate features ``(0, 1), (2, 3) ...`` of each head of ``x [T, heads, head_dim]`` up to
    ``cos``'s width by the per-token angles; the features past it pass unchanged."""
    rotary_dim = cos.shape[-1]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    pairs = rot.reshape(*rot.shape[:-1], rotary_dim // 2, 2)
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    rot = rot * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)
    return torch.cat((rot, rest), dim=-1)


class GlmDecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks, each with a residual (GLM-4, ChatGLM3)."""

    def __init__(
        self, config: GlmConfigLike, layer_idx: int, scheme: str | None, layout: LlamaShardLayout
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(
            config, layer_idx, scheme, layout, rotary=apply_interleaved_rotary
        )
        self.mlp = LlamaMLP(config, scheme, layout)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        """One block over ``h [T, hidden]``."""
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, ctx)
        out: torch.Tensor = h + self.mlp(self.post_attention_layernorm(h))
        return out


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
    #: The projections this checkpoint dialect stores fused (see ``_FUSED``).
    fused_in_checkpoint: tuple[str, ...] = ("gate_up_proj",)
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
        self.rotary = InterleavedRotaryEmbedding(rotary_dim, config.rope_theta, config.rope_scaling)
        #: What this rank reads of each unfused projection, by transformers' Llama names.
        self.llama_plan = super().shard_plan()

    def shard_plan(self) -> ShardPlan:
        """The Llama layout's slices under this checkpoint's names; fused tensors read whole."""
        plan = self.llama_plan
        slices = {
            self.checkpoint_name(name): part
            for name, part in plan.slices.items()
            if self._fused_into(name) is None
        }
        return ShardPlan(plan.rank, plan.world_size, slices)

    def checkpoint_names(self) -> list[str]:
        """The tensor names a checkpoint of this model must provide, in its own dialect."""
        return list(dict.fromkeys(map(self.checkpoint_name, super().checkpoint_names())))

    def checkpoint_name(self, name: str) -> str:
        """The checkpoint's name for our transformers-Llama-named tensor ``name``."""
        fused = self._fused_into(name)
        if fused is not None:
            path, _, kind = name.rpartition(".")
            name = f"{path.rpartition('.')[0]}.{fused}.{kind}"
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
        for part_name, part in self._split(name, tensor):
            super()._load_one(routes, params, part_name, part)

    def _fused_into(self, name: str) -> str | None:
        """The fused checkpoint projection that holds Llama-named tensor ``name``, if any."""
        projection = name.rpartition(".")[0].rpartition(".")[2]
        for fused in self.fused_in_checkpoint:
            if projection in _FUSED[fused]:
                return fused
        return None

    def _split(self, name: str, tensor: Weight) -> list[tuple[str, Weight]]:
        """A fused tensor as its projections, each cut to this rank's rows; others as is."""
        path, _, kind = name.rpartition(".")
        layer, _, projection = path.rpartition(".")
        if projection not in self.fused_in_checkpoint:
            return [(name, tensor)]
        sizes = self._full_sizes(projection)
        if not isinstance(tensor, torch.Tensor) or tensor.shape[0] != sum(sizes):
            raise ValueError(
                f"checkpoint tensor `{name}` has shape {tuple(tensor.shape)}; the model expects "
                f"{sum(sizes)} dense rows ({' + '.join(map(str, sizes))})"
            )
        parts: list[tuple[str, Weight]] = []
        for part_name, part in zip(_FUSED[projection], torch.split(tensor, sizes), strict=True):
            full_name = f"{layer}.{part_name}.{kind}"
            local = self.llama_plan.slice_of(full_name)
            if local is not None:
                part = part.narrow(local.dim, local.start, local.size)
            parts.append((full_name, part.contiguous()))
        return parts

    def _full_sizes(self, projection: str) -> list[int]:
        """Rows of each part of fused ``projection`` in the checkpoint (all ranks' rows)."""
        c = self.config
        if projection == "gate_up_proj":
            return [c.intermediate_size, c.intermediate_size]
        kv = c.num_key_value_heads * c.head_dim
        return [c.num_attention_heads * c.head_dim, kv, kv]


class Glm4ForCausalLM(GlmForCausalLM):
    """GLM-4-0414 (``Glm4ForCausalLM``): GLM with each block's output normed."""

    decoder_layer = Glm4DecoderLayer


class ChatGlmForCausalLM(GlmForCausalLM):
    """ChatGLM3 / GLM-4 original checkpoints (``ChatGLMModel``): GLM under Megatron-style
    names, q/k/v fused as ``query_key_value`` and gate/up as ``dense_h_to_4h``."""

    fused_in_checkpoint = ("qkv_proj", "gate_up_proj")
    renames = _CHATGLM_NAMES
