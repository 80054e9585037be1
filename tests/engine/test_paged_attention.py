"""``ferrollm::paged_attention`` and ``PagedKernelBackend`` against a naive float64 reference.

Random caches with shuffled block tables, random context lengths, GQA ratios 1/3/4, float32 and
bfloat16 caches and activations, sliding windows, and mixed steps (decodes, chunked prefills
over a cached prefix, fresh prefills). The engine-level parity with transformers runs through
this backend too (``test_model_parity.py`` uses the CPU platform's backend).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from ferrollm import ValidationError
from ferrollm.layers.attention import TorchSDPABackend
from ferrollm.layers.paged_attention import PagedKernelBackend, paged_attention

KV_HEADS, HEAD_DIM, BLOCK = 2, 32, 4


@dataclass
class Step:
    """A step's plan columns (what ``PagedBatch`` asks for) plus its q/k/v and caches."""

    positions: np.ndarray
    slot_mapping: np.ndarray
    cu_seqlens_q: np.ndarray
    context_lens: np.ndarray
    block_tables: np.ndarray
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor


def make_step(
    rng: np.random.Generator,
    rows: list[tuple[int, int]],
    group: int,
    act: torch.dtype,
    cache: torch.dtype,
) -> Step:
    """``rows`` of ``(new tokens, cached tokens before them)``, blocks drawn at random."""
    contexts = [n + c for n, c in rows]
    used = [-(-ctx // BLOCK) for ctx in contexts]
    max_blocks, num_blocks = max(used) + 1, sum(used) + 3
    free = rng.permutation(np.arange(1, num_blocks))
    tables = np.zeros((len(rows), max_blocks), dtype=np.int32)
    positions, slots, cu = [], [], [0]
    taken = 0
    for r, ((n, cached), ctx) in enumerate(zip(rows, contexts, strict=True)):
        tables[r, : used[r]] = free[taken : taken + used[r]]
        taken += used[r]
        pos = np.arange(cached, ctx)
        positions.append(pos)
        slots.append(tables[r, pos // BLOCK].astype(np.int64) * BLOCK + pos % BLOCK)
        cu.append(cu[-1] + n)
    num_tokens = cu[-1]
    gen = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    shape = (num_blocks, BLOCK, KV_HEADS, HEAD_DIM)
    # q/k/v as views of one fused projection, the way the model hands them over.
    qkv = torch.randn(num_tokens, (group + 2) * KV_HEADS, HEAD_DIM, generator=gen).to(act)
    q, k, v = qkv.split([group * KV_HEADS, KV_HEADS, KV_HEADS], dim=1)
    return Step(
        positions=np.concatenate(positions),
        slot_mapping=np.concatenate(slots),
        cu_seqlens_q=np.array(cu, dtype=np.int32),
        context_lens=np.array(contexts, dtype=np.int32),
        block_tables=tables,
        q=q,
        k=k,
        v=v,
        k_cache=torch.randn(shape, generator=gen).to(cache),
        v_cache=torch.randn(shape, generator=gen).to(cache),
    )


def reference(step: Step, window: int | None, scale: float) -> torch.Tensor:
    """Float64 softmax attention, one row at a time, keys found by block-table arithmetic.

    Expects the step's K/V already in the cache (so what a query sees is what the cache holds).
    """
    group = step.q.shape[1] // KV_HEADS
    out = torch.zeros(step.q.shape, dtype=torch.float64)
    kc = step.k_cache.double().reshape(-1, KV_HEADS, HEAD_DIM)
    vc = step.v_cache.double().reshape(-1, KV_HEADS, HEAD_DIM)
    for r, ctx in enumerate(step.context_lens):
        keys = np.arange(ctx)
        slots = torch.from_numpy(step.block_tables[r, keys // BLOCK] * BLOCK + keys % BLOCK)
        k = kc[slots.long()].repeat_interleave(group, dim=1)  # [ctx, heads, D]
        v = vc[slots.long()].repeat_interleave(group, dim=1)
        for t in range(step.cu_seqlens_q[r], step.cu_seqlens_q[r + 1]):
            pos = int(step.positions[t])
            seen = torch.from_numpy(keys <= pos)
            if window is not None:
                seen &= torch.from_numpy(keys > pos - window)
            scores = torch.einsum("hd,khd->hk", step.q[t].double(), k) * scale
            p = scores.masked_fill(~seen, float("-inf")).softmax(-1)
            out[t] = torch.einsum("hk,khd->hd", p, v)
    return out


def write_reference_kv(step: Step) -> None:
    slots = torch.from_numpy(step.slot_mapping)
    for cache, new in ((step.k_cache, step.k), (step.v_cache, step.v)):
        cache.view(-1, KV_HEADS, HEAD_DIM).index_copy_(0, slots, new.to(cache.dtype))


def random_rows(rng: np.random.Generator) -> list[tuple[int, int]]:
    """Decodes, chunked prefills over a cached prefix, and fresh prefills, shuffled."""
    rows = [(1, int(rng.integers(0, 40))) for _ in range(int(rng.integers(1, 5)))]
    rows += [(int(rng.integers(2, 12)), int(rng.integers(1, 30)))]
    rows += [(int(rng.integers(2, 20)), 0)]
    return [rows[i] for i in rng.permutation(len(rows))]


# (activations, cache, tolerance): float32 compute reads a bfloat16 cache exactly; bfloat16
# outputs carry bfloat16 rounding (2^-8 relative) of values of order 1.
DTYPES = [
    (torch.float32, torch.float32, 1e-5),
    (torch.float32, torch.bfloat16, 1e-5),
    (torch.bfloat16, torch.bfloat16, 2e-2),
]


@pytest.mark.parametrize(("act", "cache", "tol"), DTYPES)
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("window", [None, 6])
def test_op_matches_reference(
    act: torch.dtype, cache: torch.dtype, tol: float, group: int, window: int | None
) -> None:
    rng = np.random.default_rng(group * 10 + (window or 0))
    for _ in range(3):
        step = make_step(rng, random_rows(rng), group, act, cache)
        want_cache = step.k_cache.clone(), step.v_cache.clone()
        out = run_op(step, window, parallel=bool(rng.integers(2)))
        ref = Step(**{**step.__dict__, "k_cache": want_cache[0], "v_cache": want_cache[1]})
        write_reference_kv(ref)
        assert torch.equal(step.k_cache, ref.k_cache)
        assert torch.equal(step.v_cache, ref.v_cache)
        want = reference(ref, window, HEAD_DIM**-0.5)
        assert out.dtype == act
        torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("rows", [[(1, 200)], [(1, 37), (1, 300)]])
@pytest.mark.parametrize("window", [None, 40])
def test_fewer_decodes_than_threads_split_their_keys(
    rows: list[tuple[int, int]], window: int | None
) -> None:
    """A decode batch smaller than the kernel's threads (batch 1 on 2 cores) cuts each row's
    keys into block ranges and merges their partial softmax sums: the reference's output, and
    that of one thread walking them all. The default backend does so on torch's OpenMP team."""
    step = make_step(np.random.default_rng(len(rows)), rows, 3, torch.float32, torch.float32)
    caches = step.k_cache.clone(), step.v_cache.clone()
    split = run_op(step, window, parallel=True)
    one = Step(**{**step.__dict__, "k_cache": caches[0], "v_cache": caches[1]})
    torch.testing.assert_close(split, run_op(one, window), atol=1e-5, rtol=1e-5)
    want = reference(step, window, HEAD_DIM**-0.5)
    torch.testing.assert_close(split.double(), want, atol=1e-5, rtol=1e-5)
    backend = PagedKernelBackend()
    short = np.ones(1, dtype=np.int32)
    assert backend.parallel_for_decode(short) == backend.on_openmp


def run_op(step: Step, window: int | None, parallel: bool = False) -> torch.Tensor:
    rows = torch.arange(len(step.context_lens), dtype=torch.int32)
    return paged_attention(
        step.q,
        step.k,
        step.v,
        step.k_cache,
        step.v_cache,
        *(torch.from_numpy(a) for a in (step.slot_mapping, step.positions, step.cu_seqlens_q)),
        *(torch.from_numpy(a) for a in (step.context_lens, step.block_tables)),
        rows,
        HEAD_DIM**-0.5,
        window,
        parallel,
    )


@pytest.mark.parametrize(("act", "cache", "tol"), DTYPES)
@pytest.mark.parametrize("window", [None, 3, 64])
def test_backend_matches_reference_and_sdpa_backend(
    act: torch.dtype, cache: torch.dtype, tol: float, window: int | None
) -> None:
    rng = np.random.default_rng(1 + (window or 0))
    for _ in range(3):
        step = make_step(rng, random_rows(rng), 3, act, cache)
        before = step.k_cache.clone(), step.v_cache.clone()
        backend = PagedKernelBackend()
        metadata = backend.prepare(step, BLOCK, torch.device("cpu"), window)
        # A fresh prefill longer than the window needs the window's mask: the kernel takes it.
        assert bool(metadata.fresh) == (window != 3), "every random step has a fresh prefill"
        assert metadata.gathered is not None, "and a chunked prefill over a cached prefix"
        out = backend.forward(
            step.q, step.k, step.v, (step.k_cache, step.v_cache), metadata, HEAD_DIM**-0.5
        )
        want = reference(step, window, HEAD_DIM**-0.5)
        # Fresh prefills attend the step's own k/v, not their cache-rounded copies.
        fresh_tol = tol if cache == act else 2e-2
        torch.testing.assert_close(out.double(), want, atol=fresh_tol, rtol=fresh_tol)
        if act == cache:
            caches = before[0], before[1]
            sdpa = TorchSDPABackend()
            meta = sdpa.prepare(step, BLOCK, torch.device("cpu"), window)
            other = sdpa.forward(step.q, step.k, step.v, caches, meta, HEAD_DIM**-0.5)
            torch.testing.assert_close(out, other, atol=tol, rtol=tol)


def test_decode_only_step_uses_only_the_kernel() -> None:
    rng = np.random.default_rng(0)
    step = make_step(rng, [(1, 17), (1, 0), (1, 40)], 4, torch.float32, torch.float32)
    metadata = PagedKernelBackend().prepare(step, BLOCK, torch.device("cpu"))
    assert metadata.fresh == ()
    assert metadata.gathered is None
    assert metadata.kernel_rows.tolist() == [0, 1, 2]


def test_bad_inputs_are_refused_naming_the_field() -> None:
    rng = np.random.default_rng(0)
    step = make_step(rng, [(1, 5), (3, 0)], 1, torch.float32, torch.float32)
    step.block_tables[0, 0] = step.k_cache.shape[0]
    with pytest.raises(ValidationError, match="`block_tables` entries must be in"):
        run_op(step, None)
    step = make_step(rng, [(1, 5)], 1, torch.float32, torch.float16)
    with pytest.raises(ValueError, match="`k_cache` must be contiguous float32 or bfloat16"):
        run_op(step, None)
    step = make_step(rng, [(1, 5)], 1, torch.float32, torch.float32)
    step.slot_mapping = step.slot_mapping.astype(np.int32)
    with pytest.raises(ValueError, match=r"`slot_mapping` must be a contiguous torch\.int64"):
        run_op(step, None)


def test_op_registration_and_compile() -> None:
    """opcheck: schema, fake tensor and autograd registration agree with the real op; and
    ``torch.compile(fullgraph=True)`` takes the op as one node (no graph break)."""
    rng = np.random.default_rng(3)
    step = make_step(rng, [(1, 9), (2, 4)], 3, torch.float32, torch.bfloat16)
    rows = torch.arange(2, dtype=torch.int32)
    meta = [torch.from_numpy(a) for a in (step.slot_mapping, step.positions, step.cu_seqlens_q)]
    meta += [torch.from_numpy(a) for a in (step.context_lens, step.block_tables)]
    args = (step.q, step.k, step.v, step.k_cache, step.v_cache, *meta, rows, 0.125, None, False)
    torch.library.opcheck(paged_attention, args)
    eager = paged_attention(*args)
    compiled = torch.compile(paged_attention, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(*args), eager)
