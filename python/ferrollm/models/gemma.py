"""Gemma 2 and 3 (text): the Llama decoder with Gemma's own norms, scales and windows.

What sets it apart from ``ferrollm.models.llama``, all of it read from ``ModelConfig``:

* every norm scales by ``1 + weight`` in float32 (``OffsetRMSNorm``), and each block has a norm
  before and after it (four per layer), Gemma 3's q/k norms included;
* input embeddings are multiplied by ``sqrt(hidden_size)`` (in the activations' dtype, as
  transformers does), the tied head reading the unscaled table;
* attention scores are scaled by ``query_pre_attn_scalar ** -0.5``;
* layers interleave a sliding window (``layer_windows``: Gemma 3 five local layers, then a
  global one, each with its own base frequency; Gemma 2 every other layer) with full attention;
* the MLP is GeGLU (tanh GELU), and the final logits may be soft-capped; Gemma 2 also caps the
  attention scores (``attention_softcap``: the runner then attends through the gathered SDPA
  backend, whose math path applies it).

The weights, the KV cache, tensor parallelism and quantization are the Llama model's: only the
decoder layer, the norm and the forward differ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

from ferrollm.distributed.state import SINGLE, ParallelState
from ferrollm.layers.attention import AttentionContext
from ferrollm.layers.norm import OffsetRMSNorm
from ferrollm.layers.rotary import RotaryEmbedding
from ferrollm.models.llama import LlamaAttention, LlamaConfigLike, LlamaForCausalLM, LlamaMLP
from ferrollm.models.llama_parallel import LlamaShardLayout

if TYPE_CHECKING:
    from ferrollm.executor.step_extras import EmbeddingOverride


class GemmaConfigLike(LlamaConfigLike, Protocol):
    """What Gemma reads beyond the Llama fields (``ModelConfig`` has them)."""

    @property
    def layer_windows(self) -> tuple[int | None, ...] | None: ...
    @property
    def local_rope_theta(self) -> float | None: ...
    @property
    def local_rope_scaling(self) -> Any: ...
    @property
    def query_pre_attn_scalar(self) -> float | None: ...
    @property
    def final_logit_softcapping(self) -> float | None: ...
    @property
    def attn_logit_softcapping(self) -> float | None: ...


class GemmaDecoderLayer(torch.nn.Module):
    """Attention and MLP blocks, each normed before and after, each with a residual."""

    def __init__(
        self, config: GemmaConfigLike, layer_idx: int, scheme: str | None, layout: LlamaShardLayout
    ) -> None:
        super().__init__()
        windows = config.layer_windows or (config.sliding_window,) * config.num_hidden_layers
        #: This layer's window (None: full attention); it picks its rope too.
        self.window = windows[layer_idx]
        scalar = config.query_pre_attn_scalar
        self.self_attn = LlamaAttention(
            config,
            layer_idx,
            scheme,
            layout,
            norm=OffsetRMSNorm,
            scale=None if scalar is None else scalar**-0.5,
            window=self.window,
            softcap=config.attn_logit_softcapping,
        )
        self.mlp = LlamaMLP(config, scheme, layout)
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = OffsetRMSNorm(size, eps)
        self.post_attention_layernorm = OffsetRMSNorm(size, eps)
        self.pre_feedforward_layernorm = OffsetRMSNorm(size, eps)
        self.post_feedforward_layernorm = OffsetRMSNorm(size, eps)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        """One block over ``h [T, hidden]``; ``cos, sin`` are this layer's rope."""
        attended = self.self_attn(self.input_layernorm(h), cos, sin, ctx)
        h = h + self.post_attention_layernorm(attended)
        out: torch.Tensor = h + self.post_feedforward_layernorm(
            self.mlp(self.pre_feedforward_layernorm(h))
        )
        return out


class GemmaForCausalLM(LlamaForCausalLM):
    """Gemma 2 and Gemma 3's text decoders (``Gemma2ForCausalLM``, ``Gemma3ForCausalLM``)
    over paged attention."""

    decoder_layer = GemmaDecoderLayer
    norm = OffsetRMSNorm

    def __init__(
        self,
        config: GemmaConfigLike,
        quantization: str | None = None,
        parallel: ParallelState = SINGLE,
    ) -> None:
        super().__init__(config, quantization, parallel)
        self.config: GemmaConfigLike = config
        self.attention_softcap = config.attn_logit_softcapping
        if config.layer_windows is not None:
            # Full-attention layers read the step's own metadata; each window gets its own.
            self.sliding_window = None
            self.layer_windows = tuple(sorted({w for w in config.layer_windows if w is not None}))
        self.local_rotary = (
            None
            if config.local_rope_theta is None
            else RotaryEmbedding(
                config.head_dim, config.local_rope_theta, config.local_rope_scaling
            )
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        embeds: EmbeddingOverride | None = None,
    ) -> torch.Tensor:
        """Final hidden states ``[T, hidden]`` (see ``LlamaForCausalLM.forward``)."""
        h = self.embed(input_ids, embeds)
        # transformers multiplies by sqrt(hidden) cast to the table's dtype first.
        h = h * torch.tensor(self.config.hidden_size**0.5, dtype=h.dtype)
        rope = self.rotary.cos_sin(positions, h.dtype)
        local = rope if self.local_rotary is None else self.local_rotary.cos_sin(positions, h.dtype)
        for layer in self.model.layers:
            cos, sin = rope if layer.window is None else local
            h = layer(h, cos, sin, ctx)
        return self.model.norm(h)  # type: ignore[no-any-return]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits as ``LlamaForCausalLM.compute_logits``, soft-capped where the config says."""
        logits = super().compute_logits(hidden)
        cap = self.config.final_logit_softcapping
        if cap is None:
            return logits
        return torch.tanh(logits / cap) * cap
