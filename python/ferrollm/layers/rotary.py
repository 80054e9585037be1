"""Rotary position embeddings (rotate-half layout), with Llama 3, long-rope and YaRN scaling.

The layout is Hugging Face's: a head's first half pairs with its second half. GGUF files store
Llama Q/K weights permuted for llama.cpp's interleaved layout; the loader undoes that, so the
model only ever sees this one layout. A partial rotary (``rotary_dim`` below the head size)
turns a head's first ``rotary_dim`` dims that way and passes the rest through.

Long rope (Phi-3, Phi-4) has two sets of per-frequency factors, one for contexts up to the
pretrained ``original_max_position_embeddings`` and one past it. transformers picks the set per
forward from the sequence's current length, so a sequence that grows past the original length
switches sets with its earlier keys cached under the other: no paged cache can follow that.
Like vLLM (``Phi3LongRoPEScaledRotaryEmbedding``), ``RotaryEmbedding`` picks one set for the
whole engine from its ``max_model_len``: the long factors when sequences may grow past the
original length, else the short ones (then every sequence matches transformers exactly).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

#: Rope types this module implements (``rope_scaling["rope_type"]``); None means plain RoPE.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope", "yarn")


def rope_inv_freq(
    head_dim: int,
    rope_theta: float,
    rope_scaling: Mapping[str, Any] | None,
    *,
    long_context: bool = False,
) -> torch.Tensor:
    """The float32 inverse frequencies ``[head_dim // 2]`` for this model's RoPE
    (``head_dim``: the dims rope turns); ``long_context`` picks long rope's long factors.

    Computed exactly as transformers does (same ops, same order), so positions produce
    bit-identical angles and greedy decoding can match it token for token.
    """
    # Always on the CPU: models are built under torch.device("meta"), which must not catch this.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    rope_type = _rope_type(rope_scaling)
    if rope_scaling is not None and rope_type == "longrope":
        key = "long_factor" if long_context else "short_factor"
        factors = torch.tensor(rope_scaling[key], dtype=torch.float32, device="cpu")
        return 1.0 / (factors * rope_theta**exponents)
    inv_freq = 1.0 / (rope_theta**exponents)
    if rope_scaling is None or rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(rope_scaling["factor"])
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope_scaling)
    if rope_type == "yarn":
        return _yarn_inv_freq(head_dim, rope_theta, rope_scaling)
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


def _yarn_inv_freq(dim: int, base: float, scaling: Mapping[str, Any]) -> torch.Tensor:
    # YaRN (DeepSeek-V2/V3): frequencies interpolated by `factor` below the `beta_slow`
    # rotations over the original context, kept above `beta_fast`, a linear ramp between.
    # Mirrors transformers' _compute_yarn_parameters op for op.
    factor = float(scaling["factor"])
    original = float(scaling["original_max_position_embeddings"])

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = correction_dim(float(scaling["beta_fast"]))
    high = correction_dim(float(scaling["beta_slow"]))
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no zero-width ramp
    pos_freqs = base ** (torch.arange(0, dim, 2, device="cpu").float() / dim)
    ramp = torch.arange(dim // 2, dtype=torch.float32, device="cpu")
    ramp = torch.clamp((ramp - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def rope_attention_factor(rope_scaling: Mapping[str, Any] | None) -> float:
    """The scale on cos/sin: long rope's and YaRN's ``attention_factor`` (resolved in
    ``ModelConfig``), else 1."""
    if rope_scaling is None or _rope_type(rope_scaling) not in ("longrope", "yarn"):
        return 1.0
    return float(rope_scaling["attention_factor"])


def uses_long_factors(rope_scaling: Mapping[str, Any] | None, max_model_len: int) -> bool:
    """Whether long rope runs its long factors for an engine of ``max_model_len`` tokens: when
    a sequence may grow past the pretrained context (see the module docstring)."""
    if rope_scaling is None or _rope_type(rope_scaling) != "longrope":
        return False
    return max_model_len > int(rope_scaling["original_max_position_embeddings"])


class RotaryEmbedding:
    """Cos/sin tables for a batch of positions, computed once per step and shared by layers.

    ``rotary_dim`` (default ``head_dim``) is how many of each head's dims turn;
    ``interleaved`` repeats each angle for a pair of adjacent dims (GLM's GPT-J-style layout)
    instead of once per half;
    ``max_model_len`` (default: the original context, so long rope's short factors) is the
    longest sequence the engine runs, which picks long rope's factors (``set_max_model_len``).

    No parameters and no buffer: ``inv_freq`` must stay float32 whatever the model dtype, so it
    is kept out of ``Module.to(dtype)`` and copied to the positions' device on first use.
    """

    def __init__(
        self,
        head_dim: int,
        rope_theta: float,
        rope_scaling: Mapping[str, Any] | None,
        *,
        rotary_dim: int | None = None,
        max_model_len: int = 0,
        interleaved: bool = False,
    ) -> None:
        self.head_dim = head_dim
        self.interleaved = interleaved
        self.rotary_dim = rotary_dim or head_dim
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling
        self.attention_factor = rope_attention_factor(rope_scaling)
        #: M-RoPE (Qwen2-VL): how many frequencies turn by each of a token's temporal, height
        #: and width positions, when `cos_sin` gets ``[3, T]`` positions; None: 1-D only.
        self.mrope_section: tuple[int, ...] | None = None
        self.set_max_model_len(max_model_len)

    def set_max_model_len(self, max_model_len: int) -> None:
        """Pick the frequencies for sequences of up to ``max_model_len`` tokens (long rope's
        long factors past the original context); call before the tables are captured."""
        #: Whether long rope runs its long factors.
        self.long_context = uses_long_factors(self.rope_scaling, max_model_len)
        self.inv_freq = rope_inv_freq(
            self.rotary_dim, self.rope_theta, self.rope_scaling, long_context=self.long_context
        )

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)``, each ``[num_tokens, rotary_dim]`` in ``dtype``, for int ``positions``
        ``[num_tokens]``, or ``[3, num_tokens]`` (temporal, height, width) with M-RoPE: frequency
        ``i`` then turns by the component its `mrope_section` assigns it (cycling t, h, w), which
        is plain rope wherever the three agree."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        if positions.dim() == 2:
            freqs = self._mrope_freqs(positions)
        else:
            freqs = positions[:, None].float() * self.inv_freq
        if self.interleaved:
            emb = freqs.repeat_interleave(2, dim=-1)
        else:
            emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.attention_factor != 1.0:  # in float32 before the cast, as transformers does
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype), sin.to(dtype)

    def _mrope_freqs(self, positions: torch.Tensor) -> torch.Tensor:
        """``[T, rotary_dim // 2]`` angles of ``[3, T]`` positions, each frequency by its
        section's component."""
        if self.mrope_section is None or positions.shape[0] != 3:
            raise ValueError("3-component positions need M-RoPE sections (`mrope_section`)")
        per_component = positions[:, :, None].float() * self.inv_freq  # [3, T, dim/2]
        parts = torch.split(per_component, list(self.mrope_section), dim=-1)
        return torch.cat([part[i % 3] for i, part in enumerate(parts)], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [num_tokens, num_heads, head_dim]`` by the per-token angles in ``cos``/``sin``
    (``[num_tokens, rotary_dim]``); dims past ``rotary_dim`` pass through unchanged."""
    rotary_dim = cos.shape[-1]
    if rotary_dim < x.shape[-1]:
        turned = apply_rotary(x[..., :rotary_dim], cos, sin)
        return torch.cat((turned, x[..., rotary_dim:]), dim=-1)
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def apply_interleaved_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate features ``(0, 1), (2, 3) ...`` of each head of ``x [T, heads, head_dim]`` up to
    ``cos``'s width by the per-token angles; the features past it pass unchanged."""
    rotary_dim = cos.shape[-1]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    pairs = rot.reshape(*rot.shape[:-1], rotary_dim // 2, 2)
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    rot = rot * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)
    return torch.cat((rot, rest), dim=-1)
