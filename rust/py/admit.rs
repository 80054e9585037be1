//! `EngineLimits` for Python: the engine's own bounds and the one check of a request against
//! them (`admit`) before it is queued.

use pyo3::prelude::*;

use super::params::PySamplingParams;
use crate::validate::{admit, EngineAsks, EngineLimits};

/// The engine's own bounds: its widest beam and its model's hidden size.
#[pyclass(name = "EngineLimits", module = "ferrollm._core", frozen)]
pub struct PyEngineLimits {
    inner: EngineLimits,
}

#[pymethods]
impl PyEngineLimits {
    #[new]
    #[pyo3(signature = (*, max_beam_width, hidden_size))]
    fn new(max_beam_width: u32, hidden_size: u32) -> Self {
        PyEngineLimits {
            inner: EngineLimits {
                max_beam_width,
                hidden_size,
            },
        }
    }

    #[getter]
    fn max_beam_width(&self) -> u32 {
        self.inner.max_beam_width
    }

    #[getter]
    fn hidden_size(&self) -> u32 {
        self.inner.hidden_size
    }

    /// Admits a request with `params`: its beam width, what cannot go with beam search, and
    /// its prompt table's shape; returns the table's rows (0 without one).
    #[pyo3(signature = (params, return_generation_logits=false, prompt_table_shape=None))]
    fn admit(
        &self,
        params: PyRef<'_, PySamplingParams>,
        return_generation_logits: bool,
        prompt_table_shape: Option<Vec<usize>>,
    ) -> PyResult<u32> {
        let asks = EngineAsks {
            generation_logits: return_generation_logits,
            prompt_table_shape,
        };
        Ok(admit(&params.inner, &asks, &self.inner)?)
    }
}
