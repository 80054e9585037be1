"""Phi-3 and Phi-4 (``Phi3ForCausalLM``; Phi-4-mini and Phi-4 too): the Llama decoder with
Phi's checkpoint layout and rope.

What sets it apart from ``ferrollm.models.llama``, all of it read from ``ModelConfig``:

* checkpoints store q/k/v as one ``self_attn.qkv_proj`` and gate/up as one
  ``mlp.gate_up_proj`` tensor, the very layout of our merged layers; they load split into
  their shards (``fused_checkpoint``), each rank of a tensor-parallel group taking its rows of
  each shard, and quantize like any other weight;
* long rope (``rope_type`` "longrope", once "su"): per-frequency ``short_factor`` and
  ``long_factor`` divisors and a scale on cos/sin (the config's ``attention_factor``, else
  ``sqrt(1 + ln(factor) / ln(original_max_position_embeddings))`` with ``factor`` the
  config's or ``max_position_embeddings / original_max_position_embeddings``);
* rope may turn only the first ``partial_rotary_factor`` of each head's dims (Phi-4-mini:
  0.75), the rest passing through;
* a Mistral-style ``sliding_window`` (Phi-3-mini-4k: 2047).

Which long-rope factors: transformers switches from the short to the long set once a
sequence grows past ``original_max_position_embeddings``, recomputing every position, which a
KV cache filled under the short set cannot follow. As vLLM does, one set serves the whole
engine, chosen from its ``max_model_len`` (``set_max_model_len``, called once the KV cache is
sized): the long factors when sequences may grow past the original context, else the short
ones. An engine capped at the original context therefore matches transformers exactly; one
serving longer contexts runs short sequences on the long factors too (as vLLM does).
"""

from __future__ import annotations

from typing import Protocol

from ferrollm.layers.rotary import RotaryEmbedding
from ferrollm.models.llama import LlamaConfigLike, LlamaForCausalLM


class Phi3ConfigLike(LlamaConfigLike, Protocol):
    """What Phi-3 reads beyond the Llama fields (``ModelConfig`` has them)."""

    @property
    def partial_rotary_factor(self) -> float: ...
    @property
    def max_position_embeddings(self) -> int: ...


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi-3 / Phi-4's decoder (``Phi3ForCausalLM``) over paged attention."""

    fused_checkpoint = frozenset(["qkv_proj", "gate_up_proj"])

    def build_rotary(self, config: Phi3ConfigLike) -> RotaryEmbedding:
        """Rope over ``partial_rotary_factor`` of each head; until the engine says otherwise
        (``set_max_model_len``), sequences may run the model's whole context."""
        return RotaryEmbedding(
            config.head_dim,
            config.rope_theta,
            config.rope_scaling,
            rotary_dim=int(config.head_dim * config.partial_rotary_factor),
            max_model_len=config.max_position_embeddings,
        )
