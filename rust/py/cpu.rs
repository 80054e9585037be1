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
/// now on, through the runtime's `GOMP_parallel` at `gomp_parallel` (torch's libgomp, found by
/// `ferrollm.platforms.host`). False if a runtime was already set.
///
/// The address is trusted: `ferrollm.platforms.host` takes it from the loaded runtime.
#[pyfunction]
pub fn use_openmp(gomp_parallel: usize) -> PyResult<bool> {
    if gomp_parallel == 0 {
        return Err(PyValueError::new_err(
            "`gomp_parallel` must be a function address",
        ));
    }
    // SAFETY: the caller passes libgomp's GOMP_parallel, which stays loaded (torch holds it).
    Ok(unsafe { pool::use_openmp(gomp_parallel) })
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
