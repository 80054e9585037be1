//! The GGUF-block kernels for Python (`ferrollm.layers.ggml_linear`): torch tensors arrive as
//! data pointers with their sizes, which that module checks (dtype, device, shape, layout)
//! before passing them; the kernels check every extent they derive from those sizes. The GIL
//! is released while they run.

use half::bf16;
use pyo3::prelude::*;

use super::errors::guard;
use crate::error::{CoreError, CoreResult};
use crate::kernels::quant::{self, BlockType, Path, Segment};
use crate::kernels::{CpuFeatures, Elem};

/// # Safety
/// `ptr` must address `len` initialized `T`s that outlive the call and that nothing writes
/// meanwhile (mutable: that nothing else reads or writes).
unsafe fn slice<'a, T>(ptr: usize, len: usize) -> &'a [T] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(ptr as *const T, len) }
}

/// # Safety
/// See `slice`.
unsafe fn slice_mut<'a, T>(ptr: usize, len: usize) -> &'a mut [T] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(ptr as *mut T, len) }
}

fn block_type(id: u32) -> CoreResult<BlockType> {
    BlockType::from_ggml(id).ok_or_else(|| {
        let msg = format!(
            "`ggml_type` {id} has no kernel; supported: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K"
        );
        CoreError::invalid("ggml_type", "invalid_quantized_input", msg)
    })
}

/// The path to run: `name`, or this process's best under `FERROLLM_CPU_ISA`'s cap.
fn chosen_path(name: Option<&str>) -> CoreResult<Path> {
    name.map_or(Ok(Path::current()), Path::parse)
}

/// See `_core.pyi`. Private to `ferrollm.layers.ggml_linear`: the pointers are trusted.
#[pyfunction]
#[pyo3(signature = (x, bf16, segments, out, path=None, parallel=true))]
pub fn ggml_matmul(
    py: Python<'_>,
    x: (usize, usize, usize),
    bf16: bool,
    segments: Vec<(usize, usize, u32)>,
    out: usize,
    path: Option<&str>,
    parallel: bool,
) -> PyResult<()> {
    let (x_ptr, m, k) = x;
    let path = chosen_path(path)?;
    let mut segs = Vec::with_capacity(segments.len());
    for &(ptr, rows, id) in &segments {
        let ty = block_type(id)?;
        let len = rows * ty.row_bytes(k, "k")?;
        // SAFETY: the caller checked each weight tensor holds `rows` rows of `k` values.
        segs.push(Segment {
            ty,
            data: unsafe { slice(ptr, len) },
            rows,
        });
    }
    let n: usize = segs.iter().map(|s| s.rows).sum();
    // SAFETY: the caller checked `x` is `[m, k]` and `out` `[m, n]`, both contiguous, of the
    // dtype `bf16` names, and that `out` is a fresh tensor.
    let run = || -> CoreResult<()> {
        fn go<X: Elem>(
            a: (usize, usize, usize, usize),
            s: &[Segment<'_>],
            o: usize,
            p: Path,
            par: bool,
        ) -> CoreResult<()> {
            let (x, m, k, n) = a;
            // SAFETY: see above.
            let (x, out) = unsafe { (slice::<X>(x, m * k), slice_mut::<X>(o, m * n)) };
            quant::matmul(x, m, k, s, out, p, par)
        }
        let a = (x_ptr, m, k, n);
        if bf16 {
            go::<half::bf16>(a, &segs, out, path, parallel)
        } else {
            go::<f32>(a, &segs, out, path, parallel)
        }
    };
    Ok(py.detach(|| guard("ggml_matmul", run))??)
}

/// See `_core.pyi`. Rows `ids` of a quantized table, dequantized (an embedding lookup).
#[pyfunction]
pub fn ggml_dequantize_rows(
    py: Python<'_>,
    data: (usize, usize),
    ggml_type: u32,
    k: usize,
    ids: (usize, usize),
    out: (usize, bool),
) -> PyResult<()> {
    let ty = block_type(ggml_type)?;
    let len = data.1 * ty.row_bytes(k, "k")?;
    let run = || -> CoreResult<()> {
        // SAFETY: the caller checked the table holds `data.1` rows of `k` values, `ids` is
        // int64 `[ids.1]` and `out` a fresh contiguous `[ids.1, k]` tensor of the named dtype.
        let (table, ids_s) = unsafe { (slice::<u8>(data.0, len), slice::<i64>(ids.0, ids.1)) };
        if !out.1 {
            // SAFETY: as above.
            let out = unsafe { slice_mut::<f32>(out.0, ids.1 * k) };
            return quant::dequantize_rows(ty, table, k, ids_s, out);
        }
        let mut rows = vec![0f32; ids.1 * k];
        quant::dequantize_rows(ty, table, k, ids_s, &mut rows)?;
        // SAFETY: as above.
        let out = unsafe { slice_mut::<bf16>(out.0, ids.1 * k) };
        for (o, v) in out.iter_mut().zip(rows) {
            *o = bf16::from_f32(v);
        }
        Ok(())
    };
    Ok(py.detach(|| guard("ggml_dequantize_rows", run))??)
}

/// See `_core.pyi`. Float32 rows quantized into blocks of `ggml_type` (Q4_1 or Q8_0).
#[pyfunction]
pub fn ggml_quantize(
    py: Python<'_>,
    x: (usize, usize, usize),
    ggml_type: u32,
    out: usize,
) -> PyResult<()> {
    let ty = block_type(ggml_type)?;
    let (ptr, rows, k) = x;
    let row_bytes = ty.row_bytes(k, "k")?;
    let run = || -> CoreResult<()> {
        // SAFETY: the caller checked `x` is contiguous float32 `[rows, k]` and `out` a fresh
        // uint8 `[rows, row_bytes]`.
        let (x, out) = unsafe {
            (
                slice::<f32>(ptr, rows * k),
                slice_mut::<u8>(out, rows * row_bytes),
            )
        };
        for (xr, or) in x.chunks_exact(k).zip(out.chunks_exact_mut(row_bytes)) {
            quant::quantize_row_into(ty, xr, or)?;
        }
        Ok(())
    };
    Ok(py.detach(|| guard("ggml_quantize", run))??)
}

/// See `_core.pyi`: the paths this CPU runs under `FERROLLM_CPU_ISA`'s cap, portable first.
#[pyfunction]
pub fn ggml_kernel_paths() -> Vec<&'static str> {
    Path::available(CpuFeatures::get())
        .into_iter()
        .map(Path::name)
        .collect()
}

/// See `_core.pyi`: ggml type ids the kernels read, with (values, bytes) per block.
#[pyfunction]
pub fn ggml_block_types() -> Vec<(u32, &'static str, usize, usize)> {
    quant::ALL_TYPES
        .into_iter()
        .map(|t| (t.ggml_id(), t.name(), t.block_values(), t.block_bytes()))
        .collect()
}
