"""Linear layers whose weight is dense or quantized, and whose output may stack projections.

`Linear`'s output rows are one or more checkpoint projections ("shards"): q/k/v become one
``qkv_proj``, gate/up one ``gate_up_proj``. One matmul instead of three (or two) per layer: on
CPU at small batch the per-call overhead of separate projections is a real share of the step,
and torch's weight-only kernels parallelise over output columns, so wider is better.

A layer built with a quantization ``scheme`` holds no float weight: its shards are collected as
they load (each a dense tensor or the file's own blocks, a `GgmlBlocks`) and kept as one
`GgmlWeight` once all have arrived, each shard in its own block type, multiplied by the Rust
kernels (``ferrollm.layers.ggml_linear``). `Embedding` is the same idea for the token table: a
quantized table is looked up row by row, never dequantized whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ferrollm.layers.ggml_linear import GgmlBlocks, GgmlWeight, ggml_lookup, quantize_dense
from ferrollm.platforms import cpu_features

#: What a checkpoint gives for one tensor: dense, or the blocks the file stores it in.
Weight = torch.Tensor | GgmlBlocks
#: A layer's quantization: None (dense), "native" (what the file has, else dense), "int4", "int8".
QUANT_MODES = (None, "native", "int4", "int8")
#: Rows up to which a quantized layer that also keeps a dense copy runs its block kernel (the
#: copy is kept only where bfloat16 matmuls are fast: `keep_dense`; see
#: ``LlamaForCausalLM.set_compute_dtype``).
QUANTIZED_MAX_ROWS = 4
#: The batch-size hint oneDNN blocks a prepacked weight for (`prepack_dense`); measured good
#: from 5 to 512 rows.
_PACK_BATCH_HINT = 8


class LowRankDelta(Protocol):
    """What a `Linear` adds after its base product (``ferrollm.lora.layers.LoRALinear``)."""

    def add(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` (the base product of ``x``) plus each row's delta."""
        ...


class Linear(nn.Module):
    """``y = x @ W.T + b`` where ``W``'s rows are the named ``shards`` in order.

    ``shards`` maps each checkpoint projection (``"q_proj"``) to its output size. ``scheme``:
    None keeps a dense ``weight`` parameter; "int4"/"int8" quantize every shard to that kernel
    (round-to-nearest when the checkpoint is dense); "native" keeps each shard as the file has
    it (quantized shards on their nearest kernel, dense ones dense).
    """

    def __init__(
        self,
        in_features: int,
        shards: Sequence[tuple[str, int]],
        *,
        bias: bool,
        scheme: str | None = None,
    ) -> None:
        super().__init__()
        if scheme not in QUANT_MODES:
            raise ValueError(f"unknown quantization scheme {scheme!r}")
        self.in_features = in_features
        self.out_features = sum(size for _, size in shards)
        self.scheme = scheme
        self.shard_slices: dict[str, slice] = {}
        start = 0
        for name, size in shards:
            self.shard_slices[name] = slice(start, start + size)
            start += size
        dense = scheme is None
        self.weight = nn.Parameter(torch.empty(self.out_features, in_features)) if dense else None
        self.bias = nn.Parameter(torch.empty(self.out_features)) if bias else None
        #: The blocks once a quantized layer has loaded every shard.
        self.quantized: GgmlWeight | None = None
        #: The activations' dtype (dense shards and copies are kept in it).
        self.compute_dtype = torch.float32
        #: Keep a dense copy (in the compute dtype) of a quantized weight for calls of more
        #: than ``QUANTIZED_MAX_ROWS`` rows (set before loading; see ``QUANTIZED_MAX_ROWS``).
        self.keep_dense = False
        #: The dense copy reordered for oneDNN (`prepack_dense`), when it is kept that way.
        self.packed: torch.Tensor | None = None
        self._pending: dict[str, Weight] = {}
        #: LoRA adapters' deltas, added after the base product (``ferrollm.lora.layers``).
        self.lora: LowRankDelta | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, in]`` -> ``[T, out]``."""
        out = self.product(x, self.bias)
        return out if self.lora is None else self.lora.add(x, out)

    def product(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W.T (+ bias)`` on the kernel that suits ``x``'s row count."""
        many_rows = len(x) > QUANTIZED_MAX_ROWS
        if self.packed is not None and many_rows:
            return onednn_linear(x, self.packed, bias)
        if self.quantized is None or (self.weight is not None and many_rows):
            return F.linear(x, self.weight, bias)  # type: ignore[arg-type]
        out = self.quantized.matmul(x)
        return out if bias is None else out + bias

    def block_weight(self, x: torch.Tensor) -> GgmlWeight | None:
        """The block weight `forward` runs ``x`` on, where it adds nothing after the product (no
        bias, no adapter); else None."""
        if self.quantized is None or self.bias is not None or self.lora is not None:
            return None
        if len(x) > QUANTIZED_MAX_ROWS and (self.packed is not None or self.weight is not None):
            return None
        return self.quantized if self.quantized.runs_blocks(x) else None

    def load_shard(self, shard: str, kind: str, tensor: Weight) -> None:
        """Load checkpoint ``tensor`` as shard ``shard``'s ``kind`` ("weight" or "bias")."""
        rows = self.shard_slices[shard]
        expected = (rows.stop - rows.start, self.in_features)
        if kind == "bias":
            if self.bias is None:
                raise ValueError(f"checkpoint has a {shard} bias but the layer has none")
            copy_checked(
                self.bias.data[rows], dense_tensor(tensor, self.bias.dtype), f"{shard}.bias"
            )
            return
        check_shape(tensor, expected, f"{shard}.weight")
        if self.scheme is None:
            assert self.weight is not None
            self.weight.data[rows].copy_(dense_tensor(tensor, self.weight.dtype))
            return
        self._pending[shard] = tensor
        if len(self._pending) == len(self.shard_slices):
            self._finish()

    def load_fused(
        self, name: str, kind: str, tensor: Weight, parts: Sequence[tuple[str, int, int, int]]
    ) -> None:
        """Load checkpoint tensor ``name`` that stacks several shards along its rows (Phi-3's
        ``qkv_proj``): ``parts`` are ``(shard, rows, start, stop)`` in the tensor's order
        (``FusedPart``), and each shard loads its ``[start, stop)`` of its own rows."""
        total = sum(rows for _, rows, _, _ in parts)
        if tensor.shape[0] != total:
            raise ValueError(
                f"checkpoint tensor `{name}` has shape {tuple(tensor.shape)}; the model expects "
                f"{total} rows ({' + '.join(f'{shard} {rows}' for shard, rows, _, _ in parts)})"
            )
        offset = 0
        for shard, rows, start, stop in parts:
            self.load_shard(shard, kind, take_rows(tensor, offset + start, offset + stop))
            offset += rows

    def _finish(self) -> None:
        """Every shard is here: keep them as one block weight (or one dense weight)."""
        dtype = self.compute_dtype
        parts = [self._pending.pop(name) for name in self.shard_slices]
        if self.scheme == "native" and not any(isinstance(p, GgmlBlocks) for p in parts):
            self._keep_dense(torch.cat([dense_tensor(p, dtype) for p in parts]))
            return  # a dense tensor in a quantized file
        # A dense shard beside quantized ones: int8 loses least.
        scheme = "int8" if self.scheme == "native" else str(self.scheme)
        blocks = [p if isinstance(p, GgmlBlocks) else quantize_dense(p, scheme) for p in parts]
        if any(b is None for b in blocks):  # K is not whole blocks: no kernel reads it
            self._keep_dense(torch.cat([dense_tensor(p, dtype) for p in parts]))
            return
        # Tables made for this layer (quantized here, or reordered by the loader) are its
        # alone: interleaved in place, not copied.
        segments = [b for b in blocks if b is not None]
        self.quantized = GgmlWeight(segments, [b.owned for b in segments])
        if self.keep_dense:
            dense = self.quantized.dequantize(dtype)
            self.packed = prepack_dense(dense)
            if self.packed is None:
                self.weight = nn.Parameter(dense, requires_grad=False)

    def _keep_dense(self, dense: torch.Tensor) -> None:
        self.weight = nn.Parameter(dense, requires_grad=False)


class Embedding(nn.Module):
    """The token table: dense, or group-quantized and dequantized only for the rows looked up."""

    def __init__(self, num_embeddings: int, dim: int, *, quantized: bool) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.dim = dim
        self.weight = None if quantized else nn.Parameter(torch.empty(num_embeddings, dim))
        self.table: GgmlBlocks | None = None
        #: The dtype rows come out in.
        self.compute_dtype = torch.float32

    def load(self, tensor: Weight) -> None:
        """Fill the table from a checkpoint tensor ``[num_embeddings, dim]``."""
        check_shape(tensor, (self.num_embeddings, self.dim), "model.embed_tokens.weight")
        if self.weight is not None:
            self.weight.data.copy_(dense_tensor(tensor, self.weight.dtype))
        elif isinstance(tensor, GgmlBlocks):
            self.table = tensor
        else:
            self.weight = nn.Parameter(tensor.to(self.compute_dtype), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids [T]`` -> ``[T, dim]``."""
        if self.table is None:
            return F.embedding(ids, self.weight)  # type: ignore[arg-type]
        return embedding_lookup(self.table, ids, self.compute_dtype)


def dense_copies_pay(dtype: torch.dtype) -> bool:
    """Whether a dense copy beats the block kernels at many rows: bfloat16 where oneDNN runs
    its bfloat16 kernels on bfloat16 units (AVX512-BF16, AMX). Elsewhere the int8 dot products
    of the block kernels win at every row count (``benches/linear.py``), and a float32 copy
    would cost four bytes per weight."""
    caps = cpu_features.cpu_caps()
    return dtype == torch.bfloat16 and caps.onednn_bf16 and caps.bf16_units


def prepack_dense(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight [out, in]`` reordered into oneDNN's blocked layout for bfloat16 ``linear``, or
    None where that does not apply (not a CPU bfloat16 weight, or torch without oneDNN).

    Same bytes as the plain copy, read faster (``benches/linear.py``, 2-core AVX512-BF16 box,
    ``bf16pk`` against ``bf16``): 1.3-1.8x at M=8 (LM head 4.09 -> 2.23 ms), 1.1-1.4x at M=32,
    about 1.05x at M=256; slightly slower at M=1, which is why quantized layers use it only
    above ``QUANTIZED_MAX_ROWS`` rows (their block kernel takes the fewer rows).

    None too on a CPU without the features oneDNN's bfloat16 kernels need
    (`CpuCaps.onednn_bf16`: an AVX2-only CPU), where torch's reorder would raise: the layer
    keeps the plain copy, which torch multiplies on its own kernels there.
    """
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16:
        return None
    if not cpu_features.cpu_caps().onednn_bf16:
        return None
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return None
    reorder = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
    if reorder is None:
        return None
    packed: torch.Tensor = reorder(weight.contiguous(), _PACK_BATCH_HINT)
    return packed


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for a weight reordered by `prepack_dense`."""
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return out


def dense_tensor(tensor: Weight, dtype: torch.dtype) -> torch.Tensor:
    """A checkpoint tensor as a dense one in ``dtype`` (dequantizing `GgmlBlocks`)."""
    return tensor.dequantize(dtype) if isinstance(tensor, GgmlBlocks) else tensor.to(dtype)


def take_rows(tensor: Weight, start: int, stop: int) -> Weight:
    """Rows ``[start, stop)`` of a checkpoint tensor (a bias's elements), dense or blocks."""
    if isinstance(tensor, GgmlBlocks):
        return tensor.rows(torch.arange(start, stop))
    return tensor[start:stop]


def embedding_lookup(table: GgmlBlocks, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``ids`` of a block table in ``dtype``; an op of its own when compiled."""
    if torch.compiler.is_compiling():
        out: torch.Tensor = ggml_lookup(ids, table.data, table.ggml_type, table.k, dtype)
        return out
    return table.lookup(ids, dtype)


def copy_checked(target: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
    """``target.copy_(tensor)`` after checking shapes, naming the tensor when they differ."""
    check_shape(tensor, tuple(target.shape), name)
    target.copy_(tensor)


def check_shape(tensor: Weight, expected: tuple[int, ...], name: str) -> None:
    """Raise ValueError naming checkpoint tensor ``name`` unless its shape is ``expected``."""
    if tuple(tensor.shape) != tuple(expected):
        raise ValueError(
            f"checkpoint tensor `{name}` has shape {tuple(tensor.shape)}; "
            f"the model expects {tuple(expected)}"
        )
