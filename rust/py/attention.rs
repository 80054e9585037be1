//! `_paged_attention` for Python: the torch tensors themselves come in, and every fact the
//! kernel trusts about them (dtype, device, shape, strides, contiguity) is checked here, beside
//! the unsafe code that relies on it; everything the kernel follows *inside* them (slots, block
//! ids, positions, row bounds) is checked by the kernel. Private to
//! `ferrollm.layers.paged_attention`, which registers it as the `ferrollm::paged_attention`
//! torch op. The GIL is released while it runs.

use half::bf16;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::errors::guard;
use super::tensor::{self, Raw, Tensor};
use crate::error::CoreResult;
use crate::kernels::{attend, pool, write_kv, Dims, Elem, Rows, StepLayout};

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

impl Tensor {
    /// A float32 or bfloat16 CPU tensor `[tokens, heads, head_dim]` with heads and dims
    /// adjacent (a token stride of its own is allowed), in `like`'s dtype when given; its
    /// token stride.
    fn rows(&self, like: &str, shape: [usize; 3]) -> PyResult<usize> {
        let float = like == "torch.float32" || like == "torch.bfloat16";
        let adjacent = self.strides.len() == 3
            && self.strides[2] == 1
            && self.strides[1] == shape[2] as isize
            && self.strides[0] >= 0;
        if !float || self.dtype != like || !self.cpu || self.shape != shape || !adjacent {
            return Err(self.bad(format_args!(
                "must be a float32 or bfloat16 CPU tensor (like `q`) of shape {shape:?} with heads and dims adjacent"
            )));
        }
        Ok(self.strides[0] as usize)
    }
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
    let threads = if a.parallel { pool::num_threads() } else { 1 };
    attend(q, k_cache, v_cache, &layout, &a.dims, a.scale, out, threads)
}

fn rows_len(num_tokens: usize, stride: usize, width: usize) -> usize {
    if num_tokens == 0 {
        0
    } else {
        (num_tokens - 1) * stride + width
    }
}

/// See `_core.pyi`: `tensors` are `(q, k, v, out, k_cache, v_cache)`, `step` is
/// `(slot_mapping, positions, cu_seqlens_q, context_lens, block_tables, rows)`.
#[pyfunction]
#[pyo3(signature = (tensors, step, scale, sliding_window=None, parallel=false))]
pub fn _paged_attention(
    py: Python<'_>,
    tensors: &Bound<'_, PyTuple>,
    step: &Bound<'_, PyTuple>,
    scale: f32,
    sliding_window: Option<usize>,
    parallel: bool,
) -> PyResult<()> {
    let [q, k, v, out, k_cache, v_cache] =
        tensor::tensors(["q", "k", "v", "out", "k_cache", "v_cache"], tensors)?;
    let [slots, positions, cu, context, tables, rows] = tensor::tensors(
        [
            "slot_mapping",
            "positions",
            "cu_seqlens_q",
            "context_lens",
            "block_tables",
            "rows",
        ],
        step,
    )?;
    let dims = cache_dims(&k_cache, &v_cache)?;
    let (num_tokens, num_heads) = match q.shape.as_slice() {
        [t, h, _] if *h > 0 && h % dims.num_kv_heads == 0 => (*t, *h),
        _ => {
            return Err(q.bad(format_args!(
                "must be [tokens, heads, {}] with heads a multiple of the {} KV heads",
                dims.head_dim, dims.num_kv_heads
            )))
        }
    };
    let d = dims.head_dim;
    let q_stride = q.rows(q.dtype, [num_tokens, num_heads, d])?;
    let k_stride = k.rows(q.dtype, [num_tokens, dims.num_kv_heads, d])?;
    let v_stride = v.rows(q.dtype, [num_tokens, dims.num_kv_heads, d])?;
    out.expect(q.dtype, &[num_tokens, num_heads, d])?;
    let num_rows = context.shape.first().copied().unwrap_or(0);
    let max_blocks = tables.shape.get(1).copied().unwrap_or(0);
    slots.expect("torch.int64", &[num_tokens])?;
    positions.expect("torch.int64", &[num_tokens])?;
    cu.expect("torch.int32", &[num_rows + 1])?;
    context.expect("torch.int32", &[num_rows])?;
    tables.expect("torch.int32", &[num_rows, max_blocks])?;
    let num_listed = rows.shape.first().copied().unwrap_or(0);
    rows.expect("torch.int32", &[num_listed])?;
    let raw = |ptr, len| Raw { ptr, len };
    let kv_width = dims.num_kv_heads * d;
    let args = Args {
        q: (
            raw(q.ptr, rows_len(num_tokens, q_stride, num_heads * d)),
            q_stride,
        ),
        k: (
            raw(k.ptr, rows_len(num_tokens, k_stride, kv_width)),
            k_stride,
        ),
        v: (
            raw(v.ptr, rows_len(num_tokens, v_stride, kv_width)),
            v_stride,
        ),
        out: raw(out.ptr, num_tokens * num_heads * d),
        k_cache: raw(k_cache.ptr, dims.cache_len()),
        v_cache: raw(v_cache.ptr, dims.cache_len()),
        dims: Dims { num_heads, ..dims },
        slot_mapping: raw(slots.ptr, num_tokens),
        positions: raw(positions.ptr, num_tokens),
        cu_seqlens_q: raw(cu.ptr, num_rows + 1),
        context_lens: raw(context.ptr, num_rows),
        block_tables: raw(tables.ptr, num_rows * max_blocks),
        max_blocks,
        rows: raw(rows.ptr, num_listed),
        scale,
        sliding_window,
        parallel,
    };
    let types = (q.bf16(), k_cache.bf16());
    // SAFETY: every tensor was checked above to hold these extents of these types, contiguous
    // (or with the checked token stride) on the CPU; the caller keeps them alive for the call.
    let result = py.detach(|| {
        guard("paged_attention", || unsafe {
            match types {
                (false, false) => run::<f32, f32>(&args),
                (false, true) => run::<f32, half::bf16>(&args),
                (true, false) => run::<half::bf16, f32>(&args),
                (true, true) => run::<bf16, bf16>(&args),
            }
        })
    })?;
    Ok(result?)
}

/// The caches: both `[num_blocks, block_size, kv_heads, head_dim]`, contiguous, float32 or
/// bfloat16 alike, on the CPU.
fn cache_dims(k_cache: &Tensor, v_cache: &Tensor) -> PyResult<Dims> {
    let shape = k_cache.shape.as_slice();
    let &[num_blocks, block_size, num_kv_heads, head_dim] = shape else {
        return Err(
            k_cache.bad("and `v_cache` must both be [num_blocks, block_size, kv_heads, head_dim]")
        );
    };
    if v_cache.shape != shape || num_kv_heads == 0 {
        return Err(
            v_cache.bad("must be [num_blocks, block_size, kv_heads, head_dim] like `k_cache`")
        );
    }
    let float = k_cache.dtype == "torch.float32" || k_cache.bf16();
    for cache in [k_cache, v_cache] {
        if !float || cache.dtype != k_cache.dtype || !cache.contiguous || !cache.cpu {
            return Err(
                cache.bad("must be contiguous float32 or bfloat16 on the CPU, like `k_cache`")
            );
        }
    }
    Ok(Dims {
        num_heads: num_kv_heads,
        num_kv_heads,
        head_dim,
        num_blocks,
        block_size,
    })
}
