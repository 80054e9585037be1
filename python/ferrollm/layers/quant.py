"""Weight-only quantization: group-quantized tensors and torch's int4/int8 matmul kernels.

A checkpoint's quantized tensor arrives as a `GroupQuantized`: integers ``q [N, K]`` and, per
group of ``group_size`` consecutive input columns, a scale and an optional zero, so that
``w[n, k] = q[n, k] * scale[n, k // g] + zero[n, k // g]``. GGUF's Q4_0, Q4_1 and Q8_0 blocks are
exactly this (``executor/gguf_quant.py`` decodes them), and `quantize_rtn` makes one from a
dense weight (``--quantization int4|int8`` on a float checkpoint).

`QuantizedWeight.from_group` turns one into what a torch kernel reads, without ever building the
float weight:

* **int4** (``q`` in 0..15, groups of 32/64/128/256): ``aten._weight_int4pack_mm_for_cpu``,
  whose dequantization is ``(q - 8) * scale + zero``, so the zero is stored as
  ``zero + 8 * scale``. Q4_1 (``d * q + m``) and Q4_0 (``d * (q - 8)``) map exactly, up to
  the scales' rounding to the compute dtype.
* **int8** with one scale per output channel and no zero: ``aten._weight_int8pack_mm``.
  Q8_0's per-block scales have no exact per-channel form, so Q8_0 is re-quantized per channel
  (`to_int8_per_channel`; the error bound is tested).

Both kernels are vectorized on x86 for bfloat16 activations only (with float32 activations they
are 10-25x slower than a float32 ``linear``), so quantized weights are used with a bfloat16
compute dtype; ``ferrollm.executor.sizing.resolve_quantization`` decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: Group sizes ``_weight_int4pack_mm_for_cpu`` accepts.
INT4_GROUP_SIZES = (32, 64, 128, 256)
#: The group size `quantize_rtn` uses for int4 (GGUF's Q4 block size).
DEFAULT_INT4_GROUP = 32
#: Weight-only schemes a layer can run.
SCHEMES = ("int4", "int8")


@dataclass(frozen=True)
class GroupQuantized:
    """``w[n, k] = q[n, k] * scale[n, k // group_size] + zero[n, k // group_size]``.

    ``q`` is uint8 (0..15) for 4-bit and int8 for 8-bit, ``[N, K]``; ``scale`` and ``zero``
    (None = 0) are float32 ``[N, K // group_size]``. ``source`` names where it came from
    ("Q4_1", "rtn-int4") for log lines.
    """

    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    group_size: int
    bits: int
    source: str

    @property
    def shape(self) -> tuple[int, int]:
        """``(N, K)``: output and input features."""
        return (int(self.q.shape[0]), int(self.q.shape[1]))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight ``[N, K]`` (float32 arithmetic, then cast to ``dtype``)."""
        g = self.group_size
        w = self.q.float() * self.scale.repeat_interleave(g, dim=1)
        if self.zero is not None:
            w += self.zero.repeat_interleave(g, dim=1)
        return w.to(dtype)

    def rows(self, index: torch.Tensor) -> GroupQuantized:
        """Only output rows ``index`` (a permutation or a selection), in that order."""
        zero = None if self.zero is None else self.zero[index]
        return GroupQuantized(
            self.q[index], self.scale[index], zero, self.group_size, self.bits, self.source
        )

    @staticmethod
    def cat(parts: Sequence[GroupQuantized]) -> GroupQuantized:
        """Stack ``parts`` along the output rows; they must share bits and group size."""
        first = parts[0]
        if any((p.bits, p.group_size) != (first.bits, first.group_size) for p in parts):
            raise ValueError("cannot stack group-quantized tensors of different formats")
        zeros = [p.zero for p in parts]
        zero = None
        if any(z is not None for z in zeros):
            zero = torch.cat(
                [torch.zeros_like(p.scale) if p.zero is None else p.zero for p in parts]
            )
        return GroupQuantized(
            torch.cat([p.q for p in parts]),
            torch.cat([p.scale for p in parts]),
            zero,
            first.group_size,
            first.bits,
            first.source,
        )


def quantize_rtn(weight: torch.Tensor, scheme: str) -> GroupQuantized:
    """Round-to-nearest quantization of a float ``weight [N, K]``.

    ``int8``: symmetric, one scale per output channel (what ``_weight_int8pack_mm`` runs).
    ``int4``: asymmetric min/max per group of 32 input columns (falls back to the largest
    supported group dividing K, else per channel in int8).
    """
    w = weight.detach().float()
    n, k = w.shape
    if scheme == "int4":
        group = next((g for g in INT4_GROUP_SIZES if k % g == 0), None)
        if group is None:
            return quantize_rtn(weight, "int8")
        blocks = w.view(n, k // group, group)
        lo = blocks.amin(-1).clamp(max=0.0)
        hi = blocks.amax(-1).clamp(min=0.0)
        scale = ((hi - lo) / 15).clamp(min=torch.finfo(torch.float32).tiny)
        q = torch.round((blocks - lo[..., None]) / scale[..., None]).clamp(0, 15)
        return GroupQuantized(
            q.view(n, k).to(torch.uint8), scale, lo, group, 4, f"rtn-int4-g{group}"
        )
    if scheme == "int8":
        scale = (w.abs().amax(-1, keepdim=True) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
        return GroupQuantized(q, scale, None, k, 8, "rtn-int8")
    raise ValueError(f"unknown quantization scheme {scheme!r}; known: {', '.join(SCHEMES)}")


def to_int8_per_channel(weight: GroupQuantized) -> GroupQuantized:
    """``weight`` re-quantized to one scale per output channel (Q8_0 -> the int8 kernel).

    Each row's scale is its largest absolute value / 127, so the added error per element is
    at most half of that scale.
    """
    if weight.bits == 8 and weight.zero is None and weight.group_size == weight.shape[1]:
        return weight
    rtn = quantize_rtn(weight.dequantize(), "int8")
    return GroupQuantized(rtn.q, rtn.scale, None, rtn.group_size, 8, f"{weight.source}->int8")


def native_scheme(weight: GroupQuantized) -> str:
    """The kernel ``weight`` runs on with the least change: int4 if it maps exactly, else int8."""
    if weight.bits == 4 and weight.group_size in INT4_GROUP_SIZES:
        return "int4"
    return "int8"


class QuantizedWeight:
    """A weight packed for one of torch's weight-only kernels; ``matmul(x)`` is ``x @ w.T``."""

    def __init__(self, scheme: str, tensors: dict[str, torch.Tensor], group_size: int) -> None:
        self.scheme = scheme
        self.tensors = tensors
        self.group_size = group_size

    @classmethod
    def from_group(cls, weight: GroupQuantized, scheme: str, dtype: torch.dtype) -> QuantizedWeight:
        """Pack ``weight`` for ``scheme`` ("int4" or "int8"), re-quantizing when it must.

        ``dtype`` is the activations' dtype: the kernels want their scales in it.
        """
        if scheme == "int4":
            if weight.bits != 4 or weight.group_size not in INT4_GROUP_SIZES:
                weight = quantize_rtn(weight.dequantize(), "int4")
            if weight.bits != 4:  # no int4 group divides K
                return cls.from_group(weight, "int8", dtype)
            zero = torch.zeros_like(weight.scale) if weight.zero is None else weight.zero
            # The kernel computes (q - 8) * scale + zero; ours is q * scale + zero.
            scales_zeros = torch.stack([weight.scale.t(), (zero + 8 * weight.scale).t()], dim=-1)
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                weight.q.to(torch.int32).contiguous(), 1
            )
            return cls(
                "int4",
                {"packed": packed, "scales_zeros": scales_zeros.to(dtype).contiguous()},
                weight.group_size,
            )
        if scheme == "int8":
            weight = to_int8_per_channel(weight)
            return cls(
                "int8",
                {"q": weight.q.contiguous(), "scales": weight.scale.view(-1).to(dtype)},
                weight.group_size,
            )
        raise ValueError(f"unknown quantization scheme {scheme!r}; known: {', '.join(SCHEMES)}")

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x [M, K] @ w.T`` -> ``[M, N]`` in ``x``'s dtype."""
        t = self.tensors
        out: torch.Tensor
        if self.scheme == "int4":
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x, t["packed"], self.group_size, t["scales_zeros"]
            )
        else:
            out = torch.ops.aten._weight_int8pack_mm(x, t["q"], t["scales"])
        return out

    @property
    def nbytes(self) -> int:
        """Bytes the packed weight occupies."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())
