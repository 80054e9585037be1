"""Linear layers whose weight is dense or quantized, and whose output may stack projections.

`Linear`'s output rows are one or more checkpoint projections ("shards"): q/k/v become one
``qkv_proj``, gate/up one ``gate_up_proj``. One matmul instead of three (or two) per layer: on
CPU at small batch the per-call overhead of separate projections is a real share of the step,
and torch's weight-only kernels parallelise over output columns, so wider is better.

A layer built with a quantization ``scheme`` holds no float weight: its shards are collected as
they load (each a dense tensor or a `GroupQuantized` from the file) and packed once all have
arrived (`QuantizedWeight`). `Embedding` is the same idea for the token table: a quantized table
is looked up row by row, never dequantized whole.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ferrollm.layers.quant import GroupQuantized, QuantizedWeight, native_scheme, quantize_rtn
from ferrollm.platforms import cpu_features

#: What a checkpoint gives for one tensor: dense, or group-quantized as the file stores it.
Weight = torch.Tensor | GroupQuantized
#: A layer's quantization: None (dense), "native" (what the file has, else dense), "int4", "int8".
QUANT_MODES = (None, "native", "int4", "int8")
#: Rows up to which a quantized layer that also keeps a dense copy runs its packed kernel.
#: benches/linear.py on the default model's shapes (2-core AVX512-BF16 EPYC, torch 2.15): at
#: M=1 int4/int8 beat bfloat16 ``linear`` by 1.1-1.6x (3.4x on the LM head); from M=8 up
#: bfloat16 wins (1.2-2.2x at M=32, 2-4x at M=256), torch's weight-only kernels being tuned for
#: one row. Batched decode and prefill therefore run on the dense copy where memory allows.
QUANTIZED_MAX_ROWS = 4
#: The batch-size hint oneDNN blocks a prepacked weight for (`prepack_dense`); measured good
#: from 5 to 512 rows.
_PACK_BATCH_HINT = 8


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
        #: The packed weight once a quantized layer has loaded every shard.
        self.quantized: QuantizedWeight | None = None
        #: The activations' dtype: the quantized kernels want their scales in it.
        self.compute_dtype = torch.float32
        #: Keep a dense copy (in the compute dtype) of a quantized weight for calls of more
        #: than ``QUANTIZED_MAX_ROWS`` rows (set before loading; see ``QUANTIZED_MAX_ROWS``).
        self.keep_dense = False
        #: The dense copy reordered for oneDNN (`prepack_dense`), when it is kept that way.
        self.packed: torch.Tensor | None = None
        self._pending: dict[str, Weight] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, in]`` -> ``[T, out]``."""
        return self.product(x, self.bias)

    def product(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W.T (+ bias)`` on the kernel that suits ``x``'s row count."""
        many_rows = len(x) > QUANTIZED_MAX_ROWS
        if self.packed is not None and many_rows:
            return onednn_linear(x, self.packed, bias)
        if self.quantized is None or (self.weight is not None and many_rows):
            return F.linear(x, self.weight, bias)  # type: ignore[arg-type]
        out = self.quantized.matmul(x)
        return out if bias is None else out + bias

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

    def _finish(self) -> None:
        """Every shard is here: pack them into one quantized weight (or one dense weight)."""
        dtype = self.compute_dtype
        parts = [self._pending.pop(name) for name in self.shard_slices]
        quantized = [p for p in parts if isinstance(p, GroupQuantized)]
        if self.scheme == "native" and not quantized:  # a dense tensor in a quantized file
            dense = torch.cat([dense_tensor(p, dtype) for p in parts])
            self.weight = nn.Parameter(dense, requires_grad=False)
            return
        if self.scheme == "native":
            schemes = {native_scheme(p) for p in quantized}
            scheme = "int4" if schemes == {"int4"} else "int8"
        else:
            assert self.scheme is not None
            scheme = self.scheme
        groups = [p if isinstance(p, GroupQuantized) else quantize_rtn(p, scheme) for p in parts]
        stacked = _stack(groups, scheme)
        self.quantized = QuantizedWeight.from_group(stacked, scheme, dtype)
        if self.keep_dense:
            dense = stacked.dequantize(dtype)
            self.packed = prepack_dense(dense)
            if self.packed is None:
                self.weight = nn.Parameter(dense, requires_grad=False)


class Embedding(nn.Module):
    """The token table: dense, or group-quantized and dequantized only for the rows looked up."""

    def __init__(self, num_embeddings: int, dim: int, *, quantized: bool) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.dim = dim
        self.weight = None if quantized else nn.Parameter(torch.empty(num_embeddings, dim))
        self.table: GroupQuantized | None = None
        #: The dtype rows come out in.
        self.compute_dtype = torch.float32

    def load(self, tensor: Weight) -> None:
        """Fill the table from a checkpoint tensor ``[num_embeddings, dim]``."""
        check_shape(tensor, (self.num_embeddings, self.dim), "model.embed_tokens.weight")
        if self.weight is not None:
            self.weight.data.copy_(dense_tensor(tensor, self.weight.dtype))
        elif isinstance(tensor, GroupQuantized):
            self.table = tensor
        else:
            self.weight = nn.Parameter(tensor.to(self.compute_dtype), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids [T]`` -> ``[T, dim]``."""
        if self.table is None:
            return F.embedding(ids, self.weight)  # type: ignore[arg-type]
        t = self.table
        rows = t.q[ids].float()
        g = t.group_size
        rows = rows.view(len(ids), -1, g) * t.scale[ids][..., None]
        if t.zero is not None:
            rows = rows + t.zero[ids][..., None]
        return rows.view(len(ids), self.dim).to(self.compute_dtype)


def _stack(groups: list[GroupQuantized], scheme: str) -> GroupQuantized:
    """One group-quantized tensor of every shard's rows; shards of differing formats are
    re-quantized to ``scheme`` first."""
    if len(groups) == 1:
        return groups[0]
    formats = {(g.bits, g.group_size, g.zero is None) for g in groups}
    if len(formats) > 1:
        groups = [quantize_rtn(g.dequantize(), scheme) for g in groups]
    return GroupQuantized.cat(groups)


def prepack_dense(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight [out, in]`` reordered into oneDNN's blocked layout for bfloat16 ``linear``, or
    None where that does not apply (not a CPU bfloat16 weight, or torch without oneDNN).

    Same bytes as the plain copy, read faster (``benches/linear.py``, 2-core AVX512-BF16 box,
    ``bf16pk`` against ``bf16``): 1.3-1.8x at M=8 (LM head 4.09 -> 2.23 ms), 1.1-1.4x at M=32,
    about 1.05x at M=256; slightly slower at M=1, which is why quantized layers use it only
    above ``QUANTIZED_MAX_ROWS`` rows (their packed int4/int8 kernel takes the fewer rows).

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
    """A checkpoint tensor as a dense one in ``dtype`` (dequantizing a `GroupQuantized`)."""
    return tensor.dequantize(dtype) if isinstance(tensor, GroupQuantized) else tensor.to(dtype)


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
