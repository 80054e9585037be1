"""Long rope and partial rotary against transformers' own functions (float32, bit for bit).

The parity families only reach long rope's short factors (the engine runs the long ones only
when its ``max_model_len`` passes the original context, and transformers only for sequences
that long), so the long branch is checked here against ``ROPE_INIT_FUNCTIONS["longrope"]``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.phi3 import modeling_phi3

from ferrollm.layers.rotary import RotaryEmbedding, apply_rotary
from ferrollm.models.config import ModelConfig

ORIGINAL = 64
PHI4_MINI_LIKE: dict[str, Any] = {
    "vocab_size": 64,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,  # head 32, rope over 24 dims: 12 factors
    "partial_rotary_factor": 0.75,
    "max_position_embeddings": 16 * ORIGINAL,
    "original_max_position_embeddings": ORIGINAL,
    "rope_parameters": {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0 + 0.1 * i for i in range(12)],
        "long_factor": [1.0 + 1.5 * i for i in range(12)],
    },
}


def _both(**changes: Any) -> tuple[transformers.Phi3Config, RotaryEmbedding]:
    hf = transformers.Phi3Config(**{**PHI4_MINI_LIKE, **changes})
    config = ModelConfig.from_hf_dict({**hf.to_dict(), "architectures": ["Phi3ForCausalLM"]})
    rotary_dim = int(config.head_dim * config.partial_rotary_factor)
    ours = RotaryEmbedding(
        config.head_dim, config.rope_theta, config.rope_scaling, rotary_dim=rotary_dim
    )
    return hf, ours


@pytest.mark.parametrize("long_context", [False, True])
def test_long_rope_frequencies_and_scale_equal_transformers(long_context: bool) -> None:
    hf, ours = _both()
    seq_len = ORIGINAL + 1 if long_context else ORIGINAL
    inv_freq, scale = ROPE_INIT_FUNCTIONS["longrope"](hf, "cpu", seq_len=seq_len)
    ours.set_max_model_len(seq_len)
    assert ours.long_context is long_context
    assert torch.equal(ours.inv_freq, inv_freq)
    assert ours.attention_factor == scale > 1.0  # sqrt(1 + ln 16 / ln 64)


def test_cos_sin_equal_transformers_past_the_original_context() -> None:
    hf, ours = _both(rope_parameters={**PHI4_MINI_LIKE["rope_parameters"], "attention_factor": 1.3})
    ours.set_max_model_len(4 * ORIGINAL)
    positions = torch.arange(3 * ORIGINAL)  # a sequence this long runs the long set there
    cos, sin = modeling_phi3.Phi3RotaryEmbedding(hf)(torch.zeros(1), positions[None])
    ours_cos, ours_sin = ours.cos_sin(positions, torch.float32)
    assert ours.attention_factor == 1.3
    assert torch.equal(ours_cos, cos[0]) and torch.equal(ours_sin, sin[0])


def test_partial_rotary_turns_the_first_dims_as_transformers_does() -> None:
    hf, ours = _both()
    positions = torch.arange(10)
    cos, sin = ours.cos_sin(positions, torch.float32)
    hf_cos, _ = modeling_phi3.Phi3RotaryEmbedding(hf)(torch.zeros(1), positions[None])
    assert cos.shape == hf_cos[0].shape == (10, 24)
    q, k = torch.randn(2, 10, 3, 32).unbind(0)  # [T, heads, head_dim]
    # transformers: [batch, heads, T, head_dim] with cos/sin [batch, T, rotary_dim].
    want_q, want_k = modeling_phi3.apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None]
    )
    assert torch.equal(apply_rotary(q, cos, sin), want_q[0].transpose(0, 1))
    turned_k = apply_rotary(k, cos, sin)
    assert torch.equal(turned_k, want_k[0].transpose(0, 1))
    assert torch.equal(turned_k[..., 24:], k[..., 24:])  # the last quarter passes through
