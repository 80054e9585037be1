"""Rotary position embeddings (rotate-half layout), with Llama 3 frequency scaling.

The layout is Hugging Face's: a head's first half pairs with its second half. GGUF files store
Llama Q/K weights permuted for llama.cpp's interleaved layout; the loader undoes that, so the
model only ever sees this one layout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

#: Rope types this module implements (``rope_scaling["rope_type"]``); None means plain RoPE.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_inv_freq(
    head_dim: int, rope_theta: float, rope_scaling: Mapping[str, Any] | None
) -> torch.Tensor:
    """The float32 inverse frequencies ``[head_dim // 2]`` for this model's RoPE.

    Computed exactly as transformers does (same ops, same order), so positions produce
    bit-identical angles and greedy decoding can match it token for token.
    """
    # Always on the CPU: models are built under torch.device("meta"), which must not catch this.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (rope_theta**exponents)
    rope_type = _rope_type(rope_scaling)
    if rope_scaling is None or rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(rope_scaling["factor"])
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope_scaling)
    raise ValueError(
        f"`rope_scaling.rope_type` must be one of {', '.join(SUPPORTED_ROPE_TYPES)}; "
        f"got {rope_type!r}"
    )


def _rope_type(rope_scaling: Mapping[str, Any] | None) -> str:
    if rope_scaling is None:
        return "default"
    return str(rope_scaling.get("rope_type", rope_scaling.get("type", "default")))


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: Mapping[str, Any]) -> torch.Tensor:
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between
    # interpolated smoothly. Mirrors transformers' _compute_llama3_parameters op for op.
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling["low_freq_factor"])
    high_freq_factor = float(scaling["high_freq_factor"])
    old_context_len = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding:
    """Cos/sin tables for a batch of positions, computed once per step and shared by layers.

    No parameters and no buffer: ``inv_freq`` must stay float32 whatever the model dtype, so it
    is kept out of ``Module.to(dtype)`` and copied to the positions' device on first use.
    """

    def __init__(
        self, head_dim: int, rope_theta: float, rope_scaling: Mapping[str, Any] | None
    ) -> None:
        self.head_dim = head_dim
        self.inv_freq = rope_inv_freq(head_dim, rope_theta, rope_scaling)

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)``, each ``[num_tokens, head_dim]`` in ``dtype``, for int ``positions``."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions[:, None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [num_tokens, num_heads, head_dim]`` by the per-token angles in ``cos``/``sin``."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
