//! The GGUF-block kernels for Python (`ferrollm.layers.ggml_linear`). Torch tensors come in,
//! never addresses: `_GgmlWeight` checks its block tables once when it is made and keeps them
//! alive; each call checks the activations and output it is handed (`super::tensor`). The
//! kernels check every extent they derive from those sizes. The GIL is released while they run.

use half::bf16;
use pyo3::intern;
use pyo3::prelude::*;

use super::errors::guard;
use super::tensor::{Raw, Tensor};
use crate::error::{CoreError, CoreResult};
use crate::kernels::quant::{self, BlockType, Path, Segment};
use crate::kernels::{CpuFeatures, Elem};

fn block_type(param: &str, id: u32) -> CoreResult<BlockType> {
    BlockType::from_ggml(id).ok_or_else(|| {
        let msg = format!(
            "`{param}` {id} has no kernel; supported: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K"
        );
        CoreError::invalid(param, "invalid_quantized_input", msg)
    })
}

/// The path to run: `name`, or this process's best under `FERROLLM_CPU_ISA`'s cap.
fn chosen_path(name: Option<&str>) -> CoreResult<Path> {
    name.map_or(Ok(Path::current()), Path::parse)
}

/// A block table: a contiguous uint8 CPU tensor `[rows, row_bytes]` for rows of `k` values of
/// `ty`; its row count.
fn table_rows(t: &Tensor, ty: BlockType, k: usize) -> PyResult<usize> {
    let width = ty.row_bytes(k, "k")?;
    let rows = t.shape.first().copied().unwrap_or(0);
    t.expect("torch.uint8", &[rows, width])?;
    Ok(rows)
}

/// A float32 or bfloat16 activation or output tensor: contiguous on the CPU, `shape`.
fn float_rows(t: &Tensor, like: &str, shape: &[usize]) -> PyResult<()> {
    if like != "torch.float32" && like != "torch.bfloat16" {
        return Err(t.bad("must be a float32 or bfloat16 CPU tensor"));
    }
    t.expect(like, shape)
}

/// A product's activations `x` (`[m, k]`, made contiguous if it is not) and its fresh output
/// `[m, n]` of `x`'s dtype, both checked to be float32 or bfloat16 CPU tensors. Both tensors
/// are held here, so the addresses in `x` and `out_raw` stay valid while this lives (a
/// contiguous copy of `x` has no other owner).
struct Product<'py> {
    _x: Bound<'py, PyAny>,
    out: Bound<'py, PyAny>,
    x: Raw,
    out_raw: Raw,
    m: usize,
    bf16: bool,
}

impl<'py> Product<'py> {
    fn new(py: Python<'py>, x: Bound<'py, PyAny>, k: usize, n: usize) -> PyResult<Self> {
        let mut x = x;
        let mut xt = Tensor::read("x", &x)?;
        if !xt.contiguous && xt.cpu {
            x = x.call_method0(intern!(py, "contiguous"))?;
            xt = Tensor::read("x", &x)?;
        }
        let m = xt.shape.first().copied().unwrap_or(0);
        float_rows(&xt, xt.dtype, &[m, k])?;
        let out = x.call_method1(intern!(py, "new_empty"), ((m, n),))?;
        let ot = Tensor::read("out", &out)?;
        float_rows(&ot, xt.dtype, &[m, n])?;
        Ok(Product {
            x: Raw {
                ptr: xt.ptr,
                len: m * k,
            },
            out_raw: Raw {
                ptr: ot.ptr,
                len: m * n,
            },
            _x: x,
            out,
            m,
            bf16: xt.bf16(),
        })
    }
}

/// One segment of a weight: its tensor (kept alive here), its address and extent, and where
/// the kernels read it.
struct Held {
    _tensor: Py<PyAny>,
    data: Raw,
    rows: usize,
    ty: BlockType,
    layout: Layout,
}

/// How a segment's rows lie where the kernels read them.
enum Layout {
    /// The tensor's rows, as they are.
    Rows,
    /// An interleaved copy held here (`interleave`); the tensor's pages were paged out.
    Copy(Vec<u8>),
    /// The tensor's own bytes, interleaved in place (`in_place`: a table only this weight reads).
    InPlace,
}

impl Held {
    /// The bytes the kernels read.
    ///
    /// # Safety
    /// `data` must still address the tensor's rows (kept alive by `_tensor`).
    unsafe fn bytes(&self) -> &[u8] {
        match &self.layout {
            Layout::Copy(copy) => copy,
            // SAFETY: the caller's contract.
            Layout::Rows | Layout::InPlace => unsafe { self.data.slice::<u8>() },
        }
    }

    fn interleaved(&self) -> bool {
        !matches!(self.layout, Layout::Rows)
    }
}

/// Asks Linux to take back the whole pages of `bytes` (`MADV_PAGEOUT`), which the kernels no
/// longer read once interleaved: a memory-mapped file's pages leave the resident set (and are
/// read from the file again should anything touch them, such as a tied head's embedding
/// lookup); anonymous memory keeps its contents. Advice only: failures are ignored.
fn page_out(bytes: &[u8]) {
    #[cfg(target_os = "linux")]
    {
        /// Linux's value on every architecture (5.4 on; older kernels refuse it harmlessly).
        const MADV_PAGEOUT: libc::c_int = 21;
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(0);
        if page == 0 {
            return;
        }
        let start = (bytes.as_ptr() as usize).next_multiple_of(page);
        let end = (bytes.as_ptr() as usize + bytes.len()) / page * page;
        if end > start {
            // SAFETY: the range lies inside `bytes`' pages; MADV_PAGEOUT never changes what a
            // page holds, only where it lives.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, MADV_PAGEOUT) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = bytes;
}

/// See `_core.pyi`: a weight `[N, K]` as segments of GGUF blocks stacked along the output rows,
/// checked once here; `matmul(x)` is `x @ W.T`.
#[pyclass(name = "_GgmlWeight", module = "ferrollm._core", frozen)]
pub struct PyGgmlWeight {
    segments: Vec<Held>,
    k: usize,
    n: usize,
}

impl PyGgmlWeight {
    /// The segments as the kernels read them.
    ///
    /// # Safety
    /// As `Held::bytes`: every segment's tensor is alive (this weight keeps them).
    unsafe fn kernel_segments(&self) -> Vec<Segment<'_>> {
        self.segments
            .iter()
            .map(|s| Segment {
                ty: s.ty,
                // SAFETY: the caller's contract.
                data: unsafe { s.bytes() },
                rows: s.rows,
                interleaved: s.interleaved(),
            })
            .collect()
    }
}

#[pymethods]
impl PyGgmlWeight {
    #[new]
    #[pyo3(signature = (segments, k, interleave=true, in_place=None))]
    fn new(
        segments: Vec<(Bound<'_, PyAny>, u32)>,
        k: usize,
        interleave: bool,
        in_place: Option<Vec<bool>>,
    ) -> PyResult<Self> {
        let in_place = in_place.unwrap_or_default();
        if !in_place.is_empty() && in_place.len() != segments.len() {
            let msg = format!(
                "`in_place` must hold one flag per segment ({}); got {}",
                segments.len(),
                in_place.len()
            );
            return Err(CoreError::invalid("in_place", "invalid_format", msg).into());
        }
        let mut held = Vec::with_capacity(segments.len());
        for (i, (tensor, id)) in segments.into_iter().enumerate() {
            let ty = block_type("ggml_type", id)?;
            let t = Tensor::read("segments", &tensor)?;
            let width = ty.row_bytes(k, "k")?;
            let rows = t.shape.first().copied().unwrap_or(0);
            if t.expect("torch.uint8", &[rows, width]).is_err() {
                let message = format!(
                    "`segments[{i}]` must be a contiguous torch.uint8 CPU tensor [rows, {width}] \
                     ({} rows of {k} values); got {} {:?}",
                    ty.name(),
                    t.dtype,
                    t.shape
                );
                let param = format!("segments[{i}]");
                return Err(CoreError::invalid(param, "invalid_format", message).into());
            }
            let data = Raw {
                ptr: t.ptr,
                len: rows * width,
            };
            let fits = rows > 0 && quant::interleave::fits(ty, rows);
            let layout = if !(interleave && fits) {
                Layout::Rows
            } else {
                // SAFETY: checked above to be a contiguous CPU tensor of `rows * width` bytes,
                // alive while `tensor` is.
                let bytes = unsafe { data.slice::<u8>() };
                let copy = quant::interleave::pack(ty, bytes, width);
                if in_place.get(i).copied().unwrap_or(false) {
                    // SAFETY: as above, and the caller vouches that nothing else reads (or
                    // writes) this tensor's rows: the packed bytes replace them, same size.
                    unsafe { data.slice_mut::<u8>().copy_from_slice(&copy) };
                    Layout::InPlace
                } else {
                    page_out(bytes);
                    Layout::Copy(copy)
                }
            };
            held.push(Held {
                data,
                _tensor: tensor.unbind(),
                rows,
                ty,
                layout,
            });
        }
        if held.is_empty() {
            let msg = "`segments` must hold at least one block table";
            return Err(CoreError::invalid("segments", "invalid_format", msg).into());
        }
        let n = held.iter().map(|s| s.rows).sum();
        Ok(PyGgmlWeight {
            segments: held,
            k,
            n,
        })
    }

    /// See `_core.pyi`.
    #[pyo3(signature = (x, path=None, parallel=true))]
    fn matmul<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        path: Option<&str>,
        parallel: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let path = chosen_path(path)?;
        let io = Product::new(py, x, self.k, self.n)?;
        let (k, bf16) = (self.k, io.bf16);
        let (m, xr, or) = (io.m, io.x, io.out_raw);
        let run = || -> CoreResult<()> {
            // SAFETY: every segment was checked when this weight was made to hold `rows` rows
            // of `k` values and is kept alive by it; `x` and `out` were checked by `Product` to
            // be contiguous CPU tensors `[m, k]` and `[m, n]` of the same dtype, `out` fresh.
            let segs = unsafe { self.kernel_segments() };
            fn go<X: Elem>(
                x: Raw,
                out: Raw,
                m: usize,
                k: usize,
                s: &[Segment<'_>],
                p: Path,
                par: bool,
            ) -> CoreResult<()> {
                // SAFETY: see above.
                let (x, out) = unsafe { (x.slice::<X>(), out.slice_mut::<X>()) };
                quant::matmul(x, m, k, s, out, p, par)
            }
            if bf16 {
                go::<half::bf16>(xr, or, m, k, &segs, path, parallel)
            } else {
                go::<f32>(xr, or, m, k, &segs, path, parallel)
            }
        };
        py.detach(|| guard("ggml_matmul", run))??;
        Ok(io.out)
    }

    /// See `_core.pyi`.
    #[pyo3(signature = (x, down, path=None, parallel=true))]
    fn silu_mlp<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        down: PyRef<'py, PyGgmlWeight>,
        path: Option<&str>,
        parallel: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let path = chosen_path(path)?;
        if !self.n.is_multiple_of(2) || down.k * 2 != self.n {
            let msg = format!(
                "`down` must take {} values a row (half of this weight's {} rows: gate, then \
                 up); got {}",
                self.n / 2,
                self.n,
                down.k
            );
            return Err(CoreError::invalid("down", "invalid_quantized_input", msg).into());
        }
        let io = Product::new(py, x, self.k, down.n)?;
        if io.bf16 {
            let msg = "`x` must be float32 (the fused MLP has no bfloat16 path)";
            return Err(CoreError::invalid("x", "invalid_quantized_input", msg).into());
        }
        let (m, k, xr, or) = (io.m, self.k, io.x, io.out_raw);
        // SAFETY: as in `matmul`, for both weights (`down` is borrowed for this call).
        let (gate_up, down) = unsafe { (self.kernel_segments(), down.kernel_segments()) };
        let run = || -> CoreResult<()> {
            // SAFETY: as in `matmul`; `x` and `out` are float32 (checked above).
            let (x, out) = unsafe { (xr.slice::<f32>(), or.slice_mut::<f32>()) };
            quant::silu_mlp(x, m, k, &gate_up, &down, out, path, parallel)
        };
        py.detach(|| guard("ggml_silu_mlp", run))??;
        Ok(io.out)
    }

    /// See `_core.pyi`: the float32 weight `[N, K]` into `out`, from the blocks the kernels read.
    fn dequantize(&self, py: Python<'_>, out: &Bound<'_, PyAny>) -> PyResult<()> {
        let ot = Tensor::read("out", out)?;
        float_rows(&ot, "torch.float32", &[self.n, self.k])?;
        let or = Raw {
            ptr: ot.ptr,
            len: self.n * self.k,
        };
        let run = || -> CoreResult<()> {
            // SAFETY: the segments are checked and kept alive by this weight; `out` was checked
            // above to be a contiguous float32 CPU tensor `[n, k]`.
            let segs = unsafe { self.kernel_segments() };
            let out = unsafe { or.slice_mut::<f32>() };
            quant::dequantize(self.k, &segs, out)
        };
        py.detach(|| guard("ggml_dequantize", run))??;
        Ok(())
    }

    /// `(N, K)`: output and input features.
    #[getter]
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Bytes of the interleaved copies held beside the segments' own tensors (see `_core.pyi`).
    #[getter]
    fn copy_bytes(&self) -> usize {
        self.segments
            .iter()
            .map(|s| match &s.layout {
                Layout::Copy(copy) => copy.len(),
                Layout::Rows | Layout::InPlace => 0,
            })
            .sum()
    }

    /// Whether the kernels read each segment interleaved (see `_core.pyi`).
    #[getter]
    fn interleaved(&self) -> Vec<bool> {
        self.segments.iter().map(Held::interleaved).collect()
    }

    /// Whether each segment's own table was rewritten, interleaved in place (see `_core.pyi`).
    #[getter]
    fn in_place(&self) -> Vec<bool> {
        self.segments
            .iter()
            .map(|s| matches!(s.layout, Layout::InPlace))
            .collect()
    }
}

/// See `_core.pyi`. Rows `ids` of a block table, dequantized (an embedding lookup).
#[pyfunction]
pub fn _ggml_dequantize_rows(
    py: Python<'_>,
    table: &Bound<'_, PyAny>,
    ggml_type: u32,
    k: usize,
    ids: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let ty = block_type("ggml_type", ggml_type)?;
    let (tt, it, ot) = (
        Tensor::read("table", table)?,
        Tensor::read("ids", ids)?,
        Tensor::read("out", out)?,
    );
    let rows = table_rows(&tt, ty, k)?;
    let num = it.shape.first().copied().unwrap_or(0);
    it.expect("torch.int64", &[num])?;
    float_rows(&ot, ot.dtype, &[num, k])?;
    let table = Raw {
        ptr: tt.ptr,
        len: rows * ty.row_bytes(k, "k")?,
    };
    let (ids, out, bf16_out) = (
        Raw {
            ptr: it.ptr,
            len: num,
        },
        Raw {
            ptr: ot.ptr,
            len: num * k,
        },
        ot.bf16(),
    );
    let run = || -> CoreResult<()> {
        // SAFETY: checked above: the table holds `rows` rows of `k` values, `ids` is int64
        // `[num]` and `out` a contiguous `[num, k]` tensor of the dtype `bf16_out` names; the
        // kernel checks every id against `rows`.
        let (table, ids_s) = unsafe { (table.slice::<u8>(), ids.slice::<i64>()) };
        if !bf16_out {
            // SAFETY: as above.
            let out = unsafe { out.slice_mut::<f32>() };
            return quant::dequantize_rows(ty, table, k, ids_s, out);
        }
        let mut rows = vec![0f32; out.len];
        quant::dequantize_rows(ty, table, k, ids_s, &mut rows)?;
        // SAFETY: as above.
        let out = unsafe { out.slice_mut::<bf16>() };
        for (o, v) in out.iter_mut().zip(rows) {
            *o = bf16::from_f32(v);
        }
        Ok(())
    };
    Ok(py.detach(|| guard("ggml_dequantize_rows", run))??)
}

/// See `_core.pyi`. Float32 rows quantized into blocks of `ggml_type` (Q4_1 or Q8_0).
#[pyfunction]
pub fn _ggml_quantize(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    ggml_type: u32,
    out: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let ty = block_type("ggml_type", ggml_type)?;
    let (xt, ot) = (Tensor::read("x", x)?, Tensor::read("out", out)?);
    let (rows, k) = match xt.shape.as_slice() {
        [rows, k] => (*rows, *k),
        _ => return Err(xt.bad("must be a 2-D float32 CPU tensor")),
    };
    xt.expect("torch.float32", &[rows, k])?;
    let row_bytes = ty.row_bytes(k, "k")?;
    ot.expect("torch.uint8", &[rows, row_bytes])?;
    let (xr, or) = (
        Raw {
            ptr: xt.ptr,
            len: rows * k,
        },
        Raw {
            ptr: ot.ptr,
            len: rows * row_bytes,
        },
    );
    let run = || -> CoreResult<()> {
        // SAFETY: checked above: `x` is contiguous float32 `[rows, k]`, `out` contiguous uint8
        // `[rows, row_bytes]`.
        let (x, out) = unsafe { (xr.slice::<f32>(), or.slice_mut::<u8>()) };
        if k == 0 {
            return Ok(());
        }
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
