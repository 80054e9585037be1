//! Torch tensors handed to the kernels' private entry points (`_paged_attention`, the GGUF
//! block kernels): each tensor's facts (dtype, device, shape, strides, contiguity, address) are
//! read once through its Python API and checked beside the unsafe code that relies on them, so
//! no Python caller can hand a kernel a bare address.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;

use crate::error::CoreError;

/// A pointer and its extent, as the Python caller states them.
#[derive(Clone, Copy)]
pub(super) struct Raw {
    pub ptr: usize,
    pub len: usize,
}

impl Raw {
    /// # Safety
    /// `ptr` must address `len` initialized values of `T`, valid and unaliased-by-writers for
    /// `'a` (the caller's tensors outlive the call, which holds no GIL-released Python code).
    pub(super) unsafe fn slice<'a, T>(self) -> &'a [T] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: guaranteed by the caller, see above.
        unsafe { std::slice::from_raw_parts(self.ptr as *const T, self.len) }
    }

    /// # Safety
    /// As `slice`, and no other live reference reads or writes those values.
    pub(super) unsafe fn slice_mut<'a, T>(self) -> &'a mut [T] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: guaranteed by the caller, see above.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut T, self.len) }
    }
}

/// A torch tensor's facts, read once through its Python API.
pub(super) struct Tensor {
    pub name: &'static str,
    /// "torch.float32", "torch.bfloat16", "torch.int64", "torch.int32", "torch.uint8", or
    /// "another dtype".
    pub dtype: &'static str,
    pub cpu: bool,
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
    pub contiguous: bool,
    pub ptr: usize,
}

/// The dtypes the kernel takes, as torch's own objects (compared by identity: a dtype's text
/// per tensor per layer cost a few microseconds a call).
static DTYPES: PyOnceLock<[Py<PyAny>; 5]> = PyOnceLock::new();

fn dtype_name(py: Python<'_>, dtype: &Bound<'_, PyAny>) -> PyResult<&'static str> {
    let known = DTYPES.get_or_try_init(py, || -> PyResult<_> {
        let torch = py.import("torch")?;
        let get = |name: &str| torch.getattr(name).map(Bound::unbind);
        Ok([
            get("float32")?,
            get("bfloat16")?,
            get("int64")?,
            get("int32")?,
            get("uint8")?,
        ])
    })?;
    const FULL: [&str; 5] = [
        "torch.float32",
        "torch.bfloat16",
        "torch.int64",
        "torch.int32",
        "torch.uint8",
    ];
    let found = known.iter().position(|d| d.bind(py).is(dtype));
    Ok(found.map_or("another dtype", |i| FULL[i]))
}

impl Tensor {
    pub(super) fn read(name: &'static str, t: &Bound<'_, PyAny>) -> PyResult<Self> {
        let py = t.py();
        Ok(Tensor {
            name,
            dtype: dtype_name(py, &t.getattr(intern!(py, "dtype"))?)?,
            cpu: t.getattr(intern!(py, "is_cpu"))?.extract()?,
            shape: t.getattr(intern!(py, "shape"))?.extract()?,
            strides: t.call_method0(intern!(py, "stride"))?.extract()?,
            contiguous: t.call_method0(intern!(py, "is_contiguous"))?.extract()?,
            ptr: t.call_method0(intern!(py, "data_ptr"))?.extract()?,
        })
    }

    pub(super) fn bad(&self, rule: impl std::fmt::Display) -> PyErr {
        let message = format!(
            "`{}` {rule}; got {} {:?} with strides {:?}{}",
            self.name,
            self.dtype,
            self.shape,
            self.strides,
            if self.cpu { "" } else { " off the CPU" }
        );
        CoreError::invalid(self.name, "invalid_format", message).into()
    }

    pub(super) fn bf16(&self) -> bool {
        self.dtype == "torch.bfloat16"
    }

    /// A contiguous CPU tensor of `dtype` and `shape`.
    pub(super) fn expect(&self, dtype: &str, shape: &[usize]) -> PyResult<()> {
        if self.dtype != dtype || self.shape != shape || !self.contiguous || !self.cpu {
            return Err(self.bad(format_args!(
                "must be a contiguous {dtype} CPU tensor of shape {shape:?}"
            )));
        }
        Ok(())
    }
}

pub(super) fn tensors<const N: usize>(
    names: [&'static str; N],
    values: &Bound<'_, PyTuple>,
) -> PyResult<[Tensor; N]> {
    if values.len() != N {
        let message = format!(
            "expected {N} tensors ({}); got {}",
            names.join(", "),
            values.len()
        );
        return Err(pyo3::exceptions::PyTypeError::new_err(message));
    }
    let mut out = Vec::with_capacity(N);
    for (i, name) in names.into_iter().enumerate() {
        out.push(Tensor::read(name, &values.get_item(i)?)?);
    }
    Ok(out
        .try_into()
        .unwrap_or_else(|_| unreachable!("N tensors were read")))
}
