"""Weights kept as GGUF blocks, multiplied by the Rust kernels (``rust/kernels/quant``).

A quantized weight ``[N, K]`` is a `GgmlBlocks`: its rows' bytes exactly as the file stores
them (uint8 ``[N, row_bytes]``, a view of the memory-mapped file where the rows need no
reordering) and the ggml type. Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants Q4_K, Q5_K, Q6_K
are read as they are; a dense checkpoint served with ``--quantization int4|int8`` is quantized
into Q4_1 or Q8_0 blocks (`quantize_dense`), so it runs on the same kernels.

``ferrollm::ggml_matmul`` is the product as a torch custom op (one opaque node to
``torch.compile``): the activations (float32 or bfloat16, any CPU) are quantized once per call to
int8 groups of 32, then integer dot products run over each weight group, on the widest code the
CPU really has (AVX512-VNNI or AVX-VNNI ``dpbusd``, AVX2 ``maddubs``, else portable Rust), chosen
at run time under ``FERROLLM_CPU_ISA``'s cap. The result differs from the product of the file's
dequantized weights only by the activations' rounding: at most half an activation step
(``max|x_g| / 127`` per group ``g`` of 32 values) times the group's ``sum |w|``.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ferrollm import _core
from ferrollm.layers.ops import cpu_op
from ferrollm.platforms.host import share_openmp_with_kernels

# The kernels' jobs run on torch's OpenMP team (see `share_openmp_with_kernels`).
share_openmp_with_kernels()

_DTYPES = (torch.float32, torch.bfloat16)
#: Rows from which a float32 product dequantizes the weight and runs torch's dense matmul
#: instead of the block kernel: the kernel's time grows with every row, while dequantizing is
#: paid once per call. Default model's shapes, this repository's 2-core Xeon (AVX512-VNNI),
#: block kernel vs dequantize + matmul, ms: 3072x576 at 64 rows 2.5 vs 6.3 (noisy), 128 rows
#: 4.3 vs 5.2, 256 rows 8.7 vs 6.9, 1024 rows 39.9 vs 19.7; 576x1536 at 128 rows 2.2 vs 1.4.
DEQUANTIZE_MIN_ROWS = 128
#: The largest weight dequantized that way (float32 bytes): a prefill's transient copy stays
#: small beside the model (a 49152-row LM head is not copied).
DEQUANTIZE_MAX_BYTES = 32 << 20
#: int4 / int8 -> the ggml type a dense weight is quantized into.
SCHEME_TYPES = {"int4": 3, "int8": 8}  # Q4_1 (scale and min per 32), Q8_0


@functools.cache
def block_types() -> dict[int, tuple[str, int, int]]:
    """ggml type id -> (name, values per block, bytes per block), for the types the kernels
    read."""
    return {tid: (name, values, size) for tid, name, values, size in _core.ggml_block_types()}


def kernel_paths() -> list[str]:
    """The kernel paths this CPU runs under ``FERROLLM_CPU_ISA``'s cap, portable first (the
    last is the one used)."""
    return list(_core.ggml_kernel_paths())


def row_bytes(ggml_type: int, k: int) -> int:
    """Bytes of one row of ``k`` values; ValueError unless ``k`` is whole blocks."""
    name, values, size = block_types()[ggml_type]
    if k <= 0 or k % values:
        raise ValueError(f"`k` ({k}) must be a positive multiple of {name}'s {values}-value blocks")
    return k // values * size


@dataclass(frozen=True)
class GgmlBlocks:
    """A weight ``[N, K]`` as GGUF blocks: ``data`` uint8 ``[N, row_bytes(ggml_type, K)]``.

    ``owned``: ``data`` was made for the one layer it is loaded into (quantized at load, or
    rows reordered out of the file), so nothing else reads it and that layer's `GgmlWeight`
    may interleave it in place; False for the file's own bytes and anything shared."""

    data: torch.Tensor
    ggml_type: int
    k: int
    owned: bool = False

    def __post_init__(self) -> None:
        want = row_bytes(self.ggml_type, self.k)
        ok = self.data.dtype == torch.uint8 and self.data.dim() == 2
        if not ok or self.data.shape[1] != want or not self.data.is_contiguous():
            raise ValueError(
                f"`data` must be contiguous uint8 [rows, {want}] ({self.name} rows of {self.k} "
                f"values); got {self.data.dtype} {tuple(self.data.shape)}"
            )

    @property
    def shape(self) -> tuple[int, int]:
        """``(N, K)``: output and input features."""
        return (int(self.data.shape[0]), self.k)

    @property
    def name(self) -> str:
        """The ggml type's name ("Q4_1")."""
        return block_types()[self.ggml_type][0]

    def rows(self, index: torch.Tensor) -> GgmlBlocks:
        """Only output rows ``index``, in that order (a copy of those rows' bytes)."""
        return GgmlBlocks(self.data[index].contiguous(), self.ggml_type, self.k)

    def pad_rows(self, num_rows: int) -> GgmlBlocks:
        """Zero rows appended up to ``num_rows`` (all-zero bytes: zero scales, zero values)."""
        missing = num_rows - self.data.shape[0]
        if missing <= 0:
            return self
        pad = self.data.new_zeros((missing, self.data.shape[1]))
        return GgmlBlocks(torch.cat([self.data, pad]), self.ggml_type, self.k)

    def lookup(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``ids`` (int64 ``[T]``) dequantized to ``dtype`` ``[T, K]`` (an embedding)."""
        if dtype not in _DTYPES:
            return self.lookup(ids, torch.float32).to(dtype)
        ids = ids.to(torch.int64).contiguous()
        out = torch.empty((ids.shape[0], self.k), dtype=dtype)
        _core._ggml_dequantize_rows(self.data, self.ggml_type, self.k, ids, out)
        return out

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight ``[N, K]`` in ``dtype`` (what the file's blocks decode to)."""
        return self.lookup(torch.arange(self.data.shape[0]), dtype)


def quantize_dense(weight: torch.Tensor, scheme: str) -> GgmlBlocks | None:
    """``weight [N, K]`` rounded to nearest into Q4_1 (``int4``) or Q8_0 (``int8``) blocks, or
    None when K is not a multiple of 32 (the layer then stays dense)."""
    if scheme not in SCHEME_TYPES:
        raise ValueError(f"unknown quantization scheme {scheme!r}; known: int4, int8")
    ggml_type = SCHEME_TYPES[scheme]
    n, k = weight.shape
    if k % 32:
        return None
    w = weight.detach().to(torch.float32).contiguous()
    out = torch.empty((n, row_bytes(ggml_type, k)), dtype=torch.uint8)
    _core._ggml_quantize(w, ggml_type, out)
    return GgmlBlocks(out, ggml_type, k, owned=True)


def _ggml_matmul(
    x: torch.Tensor, weights: list[torch.Tensor], ggml_types: list[int], path: str | None = None
) -> torch.Tensor:
    """``x [M, K] @ W.T`` where ``W``'s rows are the rows of ``weights`` (uint8 blocks of
    ``ggml_types``) in order; ``[M, N]`` in ``x``'s dtype. ``path`` names a kernel path
    (`kernel_paths`; None: the best)."""
    if len(weights) != len(ggml_types):
        raise ValueError(f"{len(weights)} `weights` but {len(ggml_types)} `ggml_types`")
    k = int(x.shape[-1]) if x.dim() else 0
    weight = _held(weights, ggml_types, k)
    out: torch.Tensor = weight.matmul(x, path)
    return out


#: The checked Rust weight of each live `GgmlWeight`, by its first table's address: a compiled
#: graph hands the op its tables, and checking them again at every call cost as much as a
#: small projection's product. Weak: an unloaded model's entries go with it.
_LIVE: weakref.WeakValueDictionary[int, GgmlWeight] = weakref.WeakValueDictionary()


#: The live `GgmlWeight` that interleaved each table in place (``owned`` segments), by the
#: table's address: such a table's rows are no longer in the file's order.
_IN_PLACE: weakref.WeakValueDictionary[int, GgmlWeight] = weakref.WeakValueDictionary()


def _held(weights: list[torch.Tensor], ggml_types: list[int], k: int) -> _core._GgmlWeight:
    """The `_core._GgmlWeight` over exactly ``weights``: the live one, else a new one for this
    call alone, which reads the rows as they are (interleaving a copy, and paging out the
    tables, would cost more than the one product). ValueError for a table a live weight
    interleaved in place, passed other than as that weight's tables: its rows are not in
    the order this call would read them."""
    live = _LIVE.get(weights[0].data_ptr()) if weights else None
    if live is not None and live.k == k and live.holds(weights, ggml_types):
        return live._weight
    for table in weights:
        if table.data_ptr() in _IN_PLACE:
            raise ValueError(
                "`weights` include a table interleaved in place by a live GgmlWeight (its rows "
                "are in the kernels' layout): pass exactly that weight's tables and types"
            )
    return _core._GgmlWeight(list(zip(weights, ggml_types, strict=True)), k, interleave=False)


def _ggml_matmul_fake(
    x: torch.Tensor, weights: list[torch.Tensor], ggml_types: list[int], path: str | None = None
) -> torch.Tensor:
    n = sum(int(w.shape[0]) for w in weights)
    return x.new_empty((x.shape[0], n))


#: The registered op, for compiled graphs. Eager callers call ``_ggml_matmul`` itself: even the
#: plain dispatcher costs a few us a call.
ggml_matmul = cpu_op(
    "ggml_matmul(Tensor x, Tensor[] weights, int[] ggml_types, str? path=None) -> Tensor",
    _ggml_matmul,
    _ggml_matmul_fake,
)


def _ggml_silu_mlp(
    x: torch.Tensor,
    gate_up: list[torch.Tensor],
    gate_up_types: list[int],
    down: list[torch.Tensor],
    down_types: list[int],
) -> torch.Tensor:
    """``(silu(g) * u) @ D.T`` with ``[g | u] = x @ G.T``: ``G``'s rows those of ``gate_up``
    (gate, then up), ``D``'s those of ``down`` (`GgmlWeight.silu_mlp`)."""
    k = int(x.shape[-1]) if x.dim() else 0
    inner = sum(int(t.shape[0]) for t in gate_up) // 2
    out: torch.Tensor = _held(gate_up, gate_up_types, k).silu_mlp(x, _held(down, down_types, inner))
    return out


def _ggml_silu_mlp_fake(x: torch.Tensor, *tables: Any) -> torch.Tensor:
    down: list[torch.Tensor] = tables[2]  # after gate_up and its types
    return x.new_empty((x.shape[0], sum(int(t.shape[0]) for t in down)))


#: The fused feed-forward as an op, for compiled graphs (eager calls `GgmlWeight.silu_mlp`).
ggml_silu_mlp = cpu_op(
    "ggml_silu_mlp(Tensor x, Tensor[] gate_up, int[] gate_up_types, Tensor[] down, "
    "int[] down_types) -> Tensor",
    _ggml_silu_mlp,
    _ggml_silu_mlp_fake,
)


def _ggml_lookup(
    ids: torch.Tensor, data: torch.Tensor, ggml_type: int, k: int, dtype: torch.dtype
) -> torch.Tensor:
    """Rows ``ids`` of the block table ``data`` dequantized to ``dtype`` (`GgmlBlocks.lookup`)."""
    return GgmlBlocks(data, ggml_type, k).lookup(ids, dtype)


def _ggml_lookup_fake(
    ids: torch.Tensor, data: torch.Tensor, ggml_type: int, k: int, dtype: torch.dtype
) -> torch.Tensor:
    return torch.empty((ids.shape[0], k), dtype=dtype, device=ids.device)


#: The embedding lookup as an op, for compiled graphs (eager calls `GgmlBlocks.lookup`).
#: Registered like the matmuls: ``torch.library.custom_op``'s wrapper added 7 us a call (17 -> 10).
ggml_lookup = cpu_op(
    "ggml_lookup(Tensor ids, Tensor data, int ggml_type, int k, ScalarType dtype) -> Tensor",
    _ggml_lookup,
    _ggml_lookup_fake,
)


class GgmlWeight:
    """A layer's weight as segments of GGUF blocks stacked along the output rows (each shard
    keeps its own type: a Q4_K_M file mixes Q4_K and Q6_K); ``matmul(x)`` is ``x @ W.T``."""

    def __init__(self, segments: Sequence[GgmlBlocks], owned: Sequence[bool] = ()) -> None:
        """``owned`` flags the segments whose tables only this weight reads (made for it, such
        as ``quantize_dense``'s): those are interleaved in place, so their rows are then in
        the kernels' layout, not the file's; the others are interleaved into a copy."""
        ks = {s.k for s in segments}
        if len(ks) != 1:
            raise ValueError(f"segments must share K; got {sorted(ks)}")
        self.segments = list(segments)
        self.k = segments[0].k
        self.n = sum(s.shape[0] for s in segments)
        self._data = [s.data for s in segments]
        self._types = [s.ggml_type for s in segments]
        # The block tables, checked once and kept alive by the Rust side.
        self._weight = _core._GgmlWeight(
            [(s.data, s.ggml_type) for s in segments], self.k, in_place=list(owned)
        )
        _LIVE[self._data[0].data_ptr()] = self
        for table, moved in zip(self._data, self._weight.in_place, strict=True):
            if moved:
                _IN_PLACE[table.data_ptr()] = self

    def holds(self, weights: Sequence[torch.Tensor], ggml_types: Sequence[int]) -> bool:
        """Whether ``weights`` are this weight's own tables (the same tensors, or tensors over
        the same bytes, as a compiled graph may pass them), of ``ggml_types``."""
        same = len(weights) == len(self._data) and all(
            a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape)
            for a, b in zip(weights, self._data, strict=True)
        )
        return same and list(ggml_types) == self._types

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x [M, K] @ W.T`` -> ``[M, N]`` in ``x``'s dtype (float32 or bfloat16)."""
        if torch.compiler.is_compiling():
            compiled: torch.Tensor = ggml_matmul(x, self._data, self._types)
            return compiled
        if self._dense_pays(x):
            return x @ self.dequantize(torch.float32).T
        # The eager fast path (a decode step makes ~150 of these calls): Rust checks ``x``.
        out: torch.Tensor = self._weight.matmul(x)
        return out

    def silu_mlp(self, x: torch.Tensor, down: GgmlWeight) -> torch.Tensor:
        """``down(silu(gate(x)) * up(x))`` in one call, this weight's rows being gate's then
        up's: both products on the block kernels (``x`` float32 ``[M, K]``) and no tensor
        between them (`_core._GgmlWeight.silu_mlp`)."""
        if torch.compiler.is_compiling():
            compiled: torch.Tensor = ggml_silu_mlp(
                x, self._data, self._types, down._data, down._types
            )
            return compiled
        out: torch.Tensor = self._weight.silu_mlp(x, down._weight)
        return out

    def runs_blocks(self, x: torch.Tensor) -> bool:
        """Whether `matmul` runs ``x`` on the block kernels (not on a dequantized copy)."""
        return torch.compiler.is_compiling() or not self._dense_pays(x)

    def _dense_pays(self, x: torch.Tensor) -> bool:
        """Whether ``x`` has rows enough that dequantizing first is faster
        (``DEQUANTIZE_MIN_ROWS``), in float32, for a weight small enough to copy."""
        many = x.dim() == 2 and x.shape[0] >= DEQUANTIZE_MIN_ROWS and x.dtype == torch.float32
        return many and self.n * self.k * 4 <= DEQUANTIZE_MAX_BYTES

    def matmul_on(self, x: torch.Tensor, path: str) -> torch.Tensor:
        """`matmul` on kernel path ``path`` (one of `kernel_paths`), for tests and benches."""
        out: torch.Tensor = self._weight.matmul(x, path)
        return out

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The float weight ``[N, K]`` (a dense copy for many-row steps), decoded from the
        blocks the kernels read: an interleaved weight's original pages stay paged out."""
        out = torch.empty((self.n, self.k), dtype=torch.float32)
        self._weight.dequantize(out)
        return out if dtype == torch.float32 else out.to(dtype)

    @property
    def scheme(self) -> str:
        """The segments' types, "+"-joined ("Q4_1", "Q4_K+Q6_K")."""
        return "+".join(dict.fromkeys(s.name for s in self.segments))

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks (views of the file count too: they are read every step)."""
        return sum(s.data.numel() for s in self.segments)
