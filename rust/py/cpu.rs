//! `cpu_features()` for Python: the same detected, capped features the Rust kernels use, so the
//! torch paths (`ferrollm.platforms.cpu`) pick the same tier.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::kernels::{pool, CpuFeatures};

/// This process's CPU features after `FERROLLM_CPU_ISA`'s cap.
#[pyclass(name = "CpuFeatures", module = "ferrollm._core", frozen)]
pub struct PyCpuFeatures {
    inner: &'static CpuFeatures,
}

#[pymethods]
impl PyCpuFeatures {
    /// The cap in force: "native", "avx2" or "baseline".
    #[getter]
    fn cap(&self) -> &'static str {
        self.inner.cap.as_str()
    }

    /// The features present and allowed, named as `/proc/cpuinfo` names them.
    #[getter]
    fn names(&self) -> Vec<&'static str> {
        self.inner.names.clone()
    }

    /// The SIMD tier the Rust kernels run: "avx512", "avx2" or "generic".
    #[getter]
    fn kernel_tier(&self) -> &'static str {
        self.inner.tier.as_str()
    }

    /// Whether feature `name` is present and allowed.
    fn has(&self, name: &str) -> bool {
        self.inner.has(name)
    }

    fn __repr__(&self) -> String {
        format!(
            "CpuFeatures(cap={:?}, kernel_tier={:?}, names={:?})",
            self.inner.cap.as_str(),
            self.inner.tier.as_str(),
            self.inner.names
        )
    }
}

/// The features, detected once per process; ValueError naming `FERROLLM_CPU_ISA` if it holds
/// an unknown cap.
#[pyfunction]
pub fn cpu_features() -> PyResult<PyCpuFeatures> {
    let inner = CpuFeatures::get();
    match &inner.cap_error {
        Some(e) => Err(PyValueError::new_err(e.clone())),
        None => Ok(PyCpuFeatures { inner }),
    }
}

/// See `_core.pyi`: the kernels' parallel jobs run on the calling thread's OpenMP team from
/// now on, through `GOMP_parallel` of the runtime at `library` (torch's libgomp, which
/// `ferrollm.platforms.host` finds). The library must already be loaded, and the symbol is
/// looked up here, so no caller can hand the kernels an address. False if a runtime was already
/// set or the library exports no `GOMP_parallel`.
#[pyfunction]
pub fn _use_openmp(library: &str) -> PyResult<bool> {
    let Some(address) = loaded_symbol(library, c"GOMP_parallel")? else {
        return Ok(false);
    };
    // SAFETY: `address` is `GOMP_parallel` of an OpenMP runtime that is loaded, and stays
    // loaded: the RTLD_NOLOAD handle `loaded_symbol` took is never closed.
    Ok(unsafe { pool::use_openmp(address) })
}

/// `symbol`'s address in the already loaded library at `path`; ValueError if it is not loaded.
#[cfg(unix)]
fn loaded_symbol(path: &str, symbol: &std::ffi::CStr) -> PyResult<Option<usize>> {
    let name = std::ffi::CString::new(path)
        .map_err(|_| PyValueError::new_err("`library` must not contain a NUL byte"))?;
    // SAFETY: RTLD_NOLOAD only looks up a library already in the process (it runs no
    // initializer); both strings are NUL-terminated.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return Err(PyValueError::new_err(format!(
            "`library` {path:?} is not a library loaded in this process"
        )));
    }
    // SAFETY: `handle` is a live handle and `symbol` NUL-terminated.
    let address = unsafe { libc::dlsym(handle, symbol.as_ptr()) };
    Ok((!address.is_null()).then_some(address as usize))
}

#[cfg(not(unix))]
fn loaded_symbol(_path: &str, _symbol: &std::ffi::CStr) -> PyResult<Option<usize>> {
    Ok(None)
}

/// See `_core.pyi`: "openmp" or "rayon", where the kernels' parallel jobs run.
#[pyfunction]
pub fn kernel_threads() -> &'static str {
    if pool::on_openmp() {
        "openmp"
    } else {
        "rayon"
    }
}
