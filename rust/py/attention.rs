//! `paged_attention` for Python: torch tensors arrive as data pointers with their sizes (torch
//! tensors are not numpy arrays, and numpy has no bfloat16), so this one function trusts its
//! caller, `ferrollm.layers.paged_attention`, which checks every tensor's dtype, device, shape
//! and layout before passing it. Everything the kernel follows *inside* the tensors (slots,
//! block ids, positions, row bounds) is checked in Rust. The GIL is released while it runs.

use half::bf16;
use pyo3::prelude::*;

use super::errors::guard;
use crate::error::CoreResult;
use crate::kernels::{attend, write_kv, Dims, Elem, Rows, StepLayout};

/// A pointer and its extent, as the Python caller states them.
#[derive(Clone, Copy)]
struct Raw {
    ptr: usize,
    len: usize,
}

impl Raw {
    /// # Safety
    /// `ptr` must address `len` initialized values of `T`, valid and unaliased-by-writers for
    /// `'a` (the caller's tensors outlive the call, which holds no GIL-released Python code).
    unsafe fn slice<'a, T>(self) -> &'a [T] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: guaranteed by the caller, see above.
        unsafe { std::slice::from_raw_parts(self.ptr as *const T, self.len) }
    }

    /// # Safety
    /// As `slice`, and no other live reference reads or writes those values.
    unsafe fn slice_mut<'a, T>(self) -> &'a mut [T] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: guaranteed by the caller, see above.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut T, self.len) }
    }
}

/// The call's arguments, plain integers so they cross into the GIL-free closure.
struct Args {
    q: (Raw, usize),
    k: (Raw, usize),
    v: (Raw, usize),
    out: Raw,
    k_cache: Raw,
    v_cache: Raw,
    dims: Dims,
    slot_mapping: Raw,
    positions: Raw,
    cu_seqlens_q: Raw,
    context_lens: Raw,
    block_tables: Raw,
    max_blocks: usize,
    rows: Raw,
    scale: f32,
    sliding_window: Option<usize>,
    parallel: bool,
}

/// Writes the step's K/V into the layer's cache, then attends the listed rows.
///
/// # Safety
/// Every `Raw` in `args` must satisfy `Raw::slice` for its element type (Q for q/k/v/out, C for
/// the caches, i64 for slots and positions, i32 for the rest), `out` and the caches must not
/// overlap anything else, and the caches must not overlap each other.
unsafe fn run<Q: Elem, C: Elem>(a: &Args) -> CoreResult<()> {
    // SAFETY: the caches are read-write here and only read below, after these borrows end.
    let (k_cache, v_cache) = unsafe { (a.k_cache.slice_mut::<C>(), a.v_cache.slice_mut::<C>()) };
    // SAFETY: see the function's contract.
    let (k, v, slot_mapping) = unsafe {
        let k = Rows {
            data: a.k.0.slice::<Q>(),
            stride: a.k.1,
        };
        (
            k,
            Rows {
                data: a.v.0.slice::<Q>(),
                stride: a.v.1,
            },
            a.slot_mapping.slice::<i64>(),
        )
    };
    write_kv(k, v, slot_mapping, &a.dims, k_cache, v_cache)?;
    // SAFETY: see the function's contract.
    let layout = unsafe {
        StepLayout {
            positions: a.positions.slice(),
            slot_mapping,
            cu_seqlens_q: a.cu_seqlens_q.slice(),
            context_lens: a.context_lens.slice(),
            block_tables: a.block_tables.slice(),
            max_blocks: a.max_blocks,
            rows: a.rows.slice(),
            sliding_window: a.sliding_window,
        }
    };
    if layout.rows.is_empty() {
        return Ok(());
    }
    // SAFETY: see the function's contract.
    let (q, out) = unsafe {
        (
            Rows {
                data: a.q.0.slice::<Q>(),
                stride: a.q.1,
            },
            a.out.slice_mut::<Q>(),
        )
    };
    attend(
        q, k_cache, v_cache, &layout, &a.dims, a.scale, out, a.parallel,
    )
}

fn rows_len(num_tokens: usize, stride: usize, width: usize) -> usize {
    if num_tokens == 0 {
        0
    } else {
        (num_tokens - 1) * stride + width
    }
}

/// See `_core.pyi`. Private to `ferrollm.layers.paged_attention`: the pointers are trusted.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (q, k, v, out, k_cache, v_cache, dims, bf16, slot_mapping, positions,
    cu_seqlens_q, context_lens, block_tables, rows, scale, sliding_window, parallel))]
pub fn paged_attention(
    py: Python<'_>,
    q: (usize, usize),
    k: (usize, usize),
    v: (usize, usize),
    out: usize,
    k_cache: usize,
    v_cache: usize,
    dims: (usize, usize, usize, usize, usize, usize),
    bf16: (bool, bool),
    slot_mapping: usize,
    positions: usize,
    cu_seqlens_q: usize,
    context_lens: usize,
    block_tables: (usize, usize, usize),
    rows: (usize, usize),
    scale: f32,
    sliding_window: Option<usize>,
    parallel: bool,
) -> PyResult<()> {
    let (num_tokens, num_heads, num_kv_heads, head_dim, num_blocks, block_size) = dims;
    let dims = Dims {
        num_heads,
        num_kv_heads,
        head_dim,
        num_blocks,
        block_size,
    };
    let (num_rows, max_blocks) = (block_tables.1, block_tables.2);
    let raw = |ptr, len| Raw { ptr, len };
    let kv_width = num_kv_heads * head_dim;
    let args = Args {
        q: (
            raw(q.0, rows_len(num_tokens, q.1, num_heads * head_dim)),
            q.1,
        ),
        k: (raw(k.0, rows_len(num_tokens, k.1, kv_width)), k.1),
        v: (raw(v.0, rows_len(num_tokens, v.1, kv_width)), v.1),
        out: raw(out, num_tokens * num_heads * head_dim),
        k_cache: raw(k_cache, dims.cache_len()),
        v_cache: raw(v_cache, dims.cache_len()),
        dims,
        slot_mapping: raw(slot_mapping, num_tokens),
        positions: raw(positions, num_tokens),
        cu_seqlens_q: raw(cu_seqlens_q, num_rows + 1),
        context_lens: raw(context_lens, num_rows),
        block_tables: raw(block_tables.0, num_rows * max_blocks),
        max_blocks,
        rows: raw(rows.0, rows.1),
        scale,
        sliding_window,
        parallel,
    };
    // SAFETY: the caller checked each tensor against the sizes above (see the module doc).
    let result = py.detach(|| {
        guard("paged_attention", || unsafe {
            match bf16 {
                (false, false) => run::<f32, f32>(&args),
                (false, true) => run::<f32, half::bf16>(&args),
                (true, false) => run::<half::bf16, f32>(&args),
                (true, true) => run::<bf16, bf16>(&args),
            }
        })
    })?;
    Ok(result?)
}
