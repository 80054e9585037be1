"""GLM-4-0414 GGUF files (``general.architecture`` "glm4"), as llama.cpp's converter
(``Glm4Model``) writes them from a ``Glm4ForCausalLM`` checkpoint: q/k/v separate with their
biases and unpermuted (GLM's rope already turns adjacent pairs, as llama.cpp's does), gate/up
one ``ffn_up`` tensor ([gate; up], transformers' ``gate_up_proj``), a norm after each block,
and rope over ``rope.dimension_count`` of each head's dims. (The older "chatglm" files, whose
q/k/v are one tensor, are `gguf_chatglm`'s.)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Layer tensors named otherwise than Llama's: fused gate/up and the post-block norms.
GLM4_LAYER_TENSORS = {
    "ffn_up": "mlp.gate_up_proj",
    "post_attention_norm": "post_self_attn_layernorm",
    "post_ffw_norm": "post_mlp_layernorm",
}


def glm4_fields(meta: Mapping[str, Any], head_dim: int) -> dict[str, Any]:
    """The share of each head's dims that rope turns (GLM-4: half)."""
    rotary_dim = int(meta.get("glm4.rope.dimension_count") or head_dim)
    return {"partial_rotary_factor": rotary_dim / head_dim}
