"""Paged decode attention as a Triton kernel: the CUDA platform's attention for decode steps.

A decode step (every row one new query token) reads each row's keys and values straight out of
the paged cache through its block table, ``context_lens[r]`` tokens and no more, with an online
softmax in float32: no gathered copy of the context, no mask tensor, and nothing sized by the
step's longest row, so the kernel's launch has the same shapes whatever the contexts are. That
is what lets a decode step be captured once per batch size as a CUDA graph
(``ferrollm.platforms.cuda_graphs``). Steps with a longer query (prefill, chunked prefill,
mixed steps) run the gathered SDPA path (``TorchSDPABackend``), whose fused kernels suit them.

One program per (row, KV head): it loads the query heads that share that KV head (grouped-query
attention), walks the context ``BLOCK_N`` tokens at a time, and looks each token's block up in
the table (so the tile need not match the cache's block size). Scores may be capped
(``softcap * tanh(s / softcap)``, Gemma 2) and windowed (the last ``window`` positions).
float32 runs its dot products in IEEE float32 (not tf32): the parity mode stays exact enough
to match transformers token for token.

Triton is imported only when this module is (the CUDA platform imports it lazily); on a CPU
machine the kernel runs under Triton's interpreter (``TRITON_INTERPRET=1``), which is how the
tests check it without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from ferrollm.layers.attention import PagedBatch, SDPAMetadata, TorchSDPABackend

#: Context tokens per loop iteration of a program (half that for heads over 128 wide, so two
#: pipelined K and V tiles stay well inside a multiprocessor's shared memory).
BLOCK_N = 64
#: Warps per program and the software-pipelining depth of its loop.
NUM_WARPS = 4
NUM_STAGES = 2


@triton.jit
def _paged_decode_kernel(  # type: ignore[no-untyped-def]  # pointers and constexprs
    q_ptr,
    k_ptr,
    v_ptr,
    tables_ptr,
    lens_ptr,
    out_ptr,
    scale,
    softcap,
    window,
    stride_qn,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_t,
    stride_on,
    stride_oh,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_CAP: tl.constexpr,
    IEEE: tl.constexpr,
):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    context = tl.load(lens_ptr + row)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, DIM_PAD)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    heads = kv_head * GROUP + g
    q = tl.load(
        q_ptr + row * stride_qn + heads[:, None] * stride_qh + d[None, :],
        mask=g_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    first = 0
    if HAS_WINDOW:
        first = tl.maximum(context - window, 0)
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], dtype=tl.float32)
    for start in range((first // BLOCK_N) * BLOCK_N, context, BLOCK_N):
        tokens = start + tl.arange(0, BLOCK_N)
        valid = (tokens < context) & (tokens >= first)
        blocks = tl.load(tables_ptr + row * stride_t + tokens // BLOCK_SIZE, mask=valid, other=0)
        offsets = tokens % BLOCK_SIZE
        kv_ok = valid[:, None] & d_ok[None, :]
        k = tl.load(
            k_ptr
            + blocks[:, None].to(tl.int64) * stride_kb
            + offsets[:, None] * stride_ks
            + kv_head * stride_kh
            + d[None, :],
            mask=kv_ok,
            other=0.0,
        ).to(q.dtype)
        if IEEE:  # noqa: SIM108 (a constexpr branch, resolved when Triton compiles)
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        # float32 throughout: compiled into an inductor graph, the float arguments arrive as
        # float64 constants, and the loop-carried maxima and sums must keep one type.
        scores = (scores * scale).to(tl.float32)
        if HAS_CAP:
            # tanh(x) = 2 sigmoid(2x) - 1, in float32.
            scores = (softcap * (2.0 / (1.0 + tl.exp(-2.0 * scores / softcap)) - 1.0)).to(
                tl.float32
            )
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(
            v_ptr
            + blocks[:, None].to(tl.int64) * stride_vb
            + offsets[:, None] * stride_vs
            + kv_head * stride_vh
            + d[None, :],
            mask=kv_ok,
            other=0.0,
        ).to(q.dtype)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(
        out_ptr + row * stride_on + heads[:, None] * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=g_ok[:, None] & d_ok[None, :],
    )


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    window: int | None = None,
    softcap: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one query token per row over its paged context.

    ``q [rows, heads, D]``; ``k_cache, v_cache [num_blocks, block_size, kv_heads, D]`` (any
    dtype, read in q's); ``block_tables [rows, width]`` int32; ``context_lens [rows]`` int32,
    each at least 1 (the query's own token, already written to the cache). Returns (or fills
    ``out``) ``[rows, heads, D]`` in q's dtype.
    """
    rows, num_heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    if num_heads % kv_heads:
        raise ValueError(f"{num_heads} query heads do not split over {kv_heads} KV heads")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"`{name}` must be contiguous in its last dimension")
    group = num_heads // kv_heads
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    if out is None:
        out = torch.empty((rows, num_heads, head_dim), dtype=q.dtype, device=q.device)
    _paged_decode_kernel[(rows, kv_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        out,
        float(scale),
        float(softcap or 1.0),
        int(window or 0),
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        DIM_PAD=dim_pad,
        BLOCK_SIZE=block_size,
        BLOCK_N=BLOCK_N if dim_pad <= 128 else BLOCK_N // 2,
        HAS_WINDOW=window is not None,
        HAS_CAP=softcap is not None,
        IEEE=q.dtype == torch.float32,
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )
    return out


@dataclass(frozen=True)
class DecodeMetadata:
    """Per-step data of a decode-only step: device tensors the kernel reads (a CUDA graph
    captures them by address, so a replay sees whatever was copied into them)."""

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    sliding_window: int | None


class TritonPagedBackend(TorchSDPABackend):
    """Decode steps through `paged_decode_attention`; every other step through the gathered
    SDPA path it inherits. Scores can be capped (``softcap``) on either path."""

    name = "triton_paged"

    def prepare(  # type: ignore[override]  # decode steps get their own metadata
        self,
        batch: PagedBatch,
        block_size: int,
        device: torch.device,
        sliding_window: int | None = None,
    ) -> SDPAMetadata | DecodeMetadata:
        """`DecodeMetadata` when every row has one query token, else the SDPA metadata."""
        cu = batch.cu_seqlens_q
        if int(cu[-1]) != len(cu) - 1:
            return super().prepare(batch, block_size, device, sliding_window)

        def put(array: np.ndarray[Any, Any]) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array)).to(device, non_blocking=True)

        return DecodeMetadata(
            slot_mapping=put(batch.slot_mapping.astype(np.int64, copy=False)),
            block_tables=put(batch.block_tables.astype(np.int32, copy=False)),
            context_lens=put(batch.context_lens.astype(np.int32, copy=False)),
            sliding_window=sliding_window,
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        metadata: SDPAMetadata | DecodeMetadata,
        scale: float,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """Write the step's K/V, then attend (see the class docstring)."""
        if isinstance(metadata, SDPAMetadata):
            return super().forward(q, k, v, kv_cache, metadata, scale, softcap)
        k_cache, v_cache = kv_cache
        num_kv_heads, head_dim = k.shape[1], k.shape[2]
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(
            0, metadata.slot_mapping, k.to(k_cache.dtype)
        )
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(
            0, metadata.slot_mapping, v.to(v_cache.dtype)
        )
        return paged_decode_attention(
            q.contiguous(),
            k_cache,
            v_cache,
            metadata.block_tables,
            metadata.context_lens,
            scale,
            window=metadata.sliding_window,
            softcap=softcap,
        )
