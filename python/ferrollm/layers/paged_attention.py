"""Paged attention that reads the KV cache in place: the Rust kernel as a torch custom op.

``ferrollm::paged_attention`` writes the step's K/V into a layer's cache at ``slot_mapping``
(converting to the cache dtype) and attends the listed rows' queries over their context, each
query walking its row's block table (no gather into a padded batch); the query heads that share
a KV head are computed together so each K/V row is read once, and the softmax is online with
float32 accumulation. q/k/v/out and the cache are float32 or bfloat16, independently. Being a
custom op (with a fake implementation and the cache marked as mutated), it is one opaque node
to ``torch.compile``.

``PagedKernelBackend`` is the CPU platform's attention: the kernel for decode rows (one
query); SDPA's causal path on the step's own k/v for fresh prefills (a row whose context is
exactly its new tokens: no cache read at all); and the gather-then-SDPA path of
``TorchSDPABackend`` for the remaining multi-token rows (chunked prefill over a cached
prefix), where torch's blocked GEMMs beat a walk per query: on SmolLM2 shapes, 64 new tokens
over 448 cached took 1.5 ms gathered vs 5.4 ms in the kernel, 512 over 1536 23 ms vs 168 ms.
Decode numbers are in ``benches/attention.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ferrollm import _core
from ferrollm.layers.attention import (
    PagedBatch,
    RowGroup,
    attend_group,
    group_to_device,
    plan_group,
)
from ferrollm.layers.ops import cpu_op


def _paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    positions: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    rows: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    parallel: bool = False,
) -> torch.Tensor:
    """Write ``k, v [T, kv_heads, D]`` at ``slot_mapping``; attend ``q [T, heads, D]`` of ``rows``.

    Caches are ``[num_blocks, block_size, kv_heads, D]``, contiguous. ``q, k, v`` may be views
    with a token stride (heads and dims adjacent). The output is a new contiguous tensor like
    ``q``; tokens of rows not in ``rows`` are left uninitialized for the caller to fill.
    Metadata: ``slot_mapping, positions`` int64 ``[T]``; ``cu_seqlens_q`` int32 ``[R + 1]``;
    ``context_lens`` int32 ``[R]``; ``block_tables`` int32 ``[R, max_blocks]``; ``rows`` int32.
    """
    out = torch.empty(q.shape, dtype=q.dtype)
    # The kernel checks every tensor's dtype, device, shape and layout (rust/py/attention.rs).
    _core._paged_attention(
        (q, k, v, out, k_cache, v_cache),
        (slot_mapping, positions, cu_seqlens_q, context_lens, block_tables, rows),
        scale,
        sliding_window,
        parallel,
    )
    return out


def _paged_attention_fake(q: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


#: The registered op. Eager callers may call ``_paged_attention`` itself: the dispatcher adds
#: a few us per call, and only compilation needs the op.
paged_attention = cpu_op(
    "paged_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, "
    "Tensor slot_mapping, Tensor positions, Tensor cu_seqlens_q, Tensor context_lens, "
    "Tensor block_tables, Tensor rows, float scale, int? sliding_window=None, "
    "bool parallel=False) -> Tensor",
    _paged_attention,
    _paged_attention_fake,
)


@dataclass(frozen=True)
class PagedKernelMetadata:
    """Per-step data of ``PagedKernelBackend``, built once and shared by every layer."""

    slot_mapping: torch.Tensor
    positions: torch.Tensor
    cu_seqlens_q: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    #: Rows the kernel attends (int32).
    kernel_rows: torch.Tensor
    #: ``(start, end)`` token ranges of fresh prefills, attended with SDPA's causal path.
    fresh: tuple[tuple[int, int], ...]
    #: The other multi-token rows, gathered from the cache for one SDPA call (None: no such row).
    gathered: RowGroup | None
    sliding_window: int | None
    #: Spread the kernel over its pool's threads (see ``PagedKernelBackend``).
    parallel: bool


class PagedKernelBackend:
    """Paged attention with the ``ferrollm::paged_attention`` kernel (CPU).

    ``parallel`` spreads the kernel over the threads of its pool instead of the calling thread
    (with fewer decodes than threads, each one's keys are cut into ranges whose partial
    softmax sums are merged). By default (None) every step does when the kernels run on
    torch's own OpenMP team (``share_openmp_with_kernels``), the usual case; on rayon's pool
    only a step that attends at least ``PARALLEL_MIN_KEYS`` keys does: torch's OpenMP workers
    keep spinning after each matmul, and a short kernel on rayon fights them for the cores
    (measured over 30 matmul + attention layers on 2 cores: batch 8-32 at context 512 ran
    10-45% slower on rayon, batch 32 at context 2048 13-20% faster).
    """

    name = "paged_kernel"
    PARALLEL_MIN_KEYS = 1 << 15

    def __init__(self, parallel: bool | None = None) -> None:
        # Imported here: ferrollm.platforms' package imports this module (the CPU platform).
        from ferrollm.platforms.host import share_openmp_with_kernels

        self.parallel = parallel
        #: The kernel's jobs run on torch's OpenMP team (no other pool fights it for the cores).
        self.on_openmp = share_openmp_with_kernels()

    def prepare(
        self,
        batch: PagedBatch,
        block_size: int,
        device: torch.device,
        sliding_window: int | None = None,
    ) -> PagedKernelMetadata:
        """Metadata tensors (zero-copy views of the plan where the dtypes already match)."""
        cu = np.ascontiguousarray(batch.cu_seqlens_q, dtype=np.int32)
        context_lens = np.ascontiguousarray(batch.context_lens, dtype=np.int32)
        q_lens = cu[1:] - cu[:-1]
        # A fresh prefill sees exactly its own tokens: SDPA's causal path, no cache read.
        is_decode = q_lens == 1
        is_fresh = ~is_decode & (q_lens == context_lens)
        if sliding_window is not None:
            is_fresh &= q_lens <= sliding_window
        fresh_rows = np.flatnonzero(is_fresh)
        kernel_rows = np.flatnonzero(is_decode).astype(np.int32)
        gathered_rows = np.flatnonzero(~is_decode & ~is_fresh)
        gathered = None
        if len(gathered_rows) > 0:
            cu64 = cu.astype(np.int64)
            group = plan_group(
                batch, gathered_rows, cu64, q_lens.astype(np.int64), block_size, sliding_window
            )
            gathered = group_to_device(group, int(cu[-1]), device)

        def tensor(a: np.ndarray, dtype: type) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=dtype))

        return PagedKernelMetadata(
            slot_mapping=tensor(batch.slot_mapping, np.int64),
            positions=tensor(batch.positions, np.int64),
            cu_seqlens_q=torch.from_numpy(cu),
            context_lens=torch.from_numpy(context_lens),
            block_tables=tensor(batch.block_tables, np.int32),
            kernel_rows=torch.from_numpy(kernel_rows),
            fresh=tuple((int(cu[r]), int(cu[r + 1])) for r in fresh_rows),
            gathered=gathered,
            sliding_window=sliding_window,
            parallel=self._parallel(q_lens, context_lens, kernel_rows),
        )

    def _parallel(self, q_lens: np.ndarray, context_lens: np.ndarray, rows: np.ndarray) -> bool:
        if self.parallel is not None:
            return self.parallel
        num_keys = int((q_lens[rows].astype(np.int64) * context_lens[rows]).sum())
        return self.on_openmp or num_keys >= self.PARALLEL_MIN_KEYS

    def parallel_for_decode(self, context_lens: np.ndarray) -> bool:
        """Whether a decode step (one query per row) over ``context_lens`` runs in parallel."""
        if self.parallel is not None:
            return self.parallel
        num_keys = int(context_lens.astype(np.int64).sum())
        return self.on_openmp or num_keys >= self.PARALLEL_MIN_KEYS

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        metadata: PagedKernelMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Write the step's K/V and attend decodes in one op; SDPA for the multi-token rows."""
        m = metadata
        op = paged_attention if torch.compiler.is_compiling() else _paged_attention
        out: torch.Tensor = op(
            q,
            k,
            v,
            kv_cache[0],
            kv_cache[1],
            m.slot_mapping,
            m.positions,
            m.cu_seqlens_q,
            m.context_lens,
            m.block_tables,
            m.kernel_rows,
            scale,
            m.sliding_window,
            m.parallel,
        )
        gqa = q.shape[1] != k.shape[1]
        for start, end in m.fresh:
            qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
            o = F.scaled_dot_product_attention(
                qs, ks, vs, is_causal=True, scale=scale, enable_gqa=gqa
            )
            out[start:end] = o.transpose(0, 1)
        if m.gathered is not None:  # gather + SDPA, as TorchSDPABackend does (cast to q's dtype)
            group = m.gathered
            k_flat, v_flat = (c.view(-1, c.shape[2], c.shape[3]) for c in kv_cache)
            o = attend_group(q, k_flat, v_flat, group, scale, gqa)
            out.index_copy_(0, group.out_dst, o.index_select(0, group.out_src))
        return out
