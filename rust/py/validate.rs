//! `validate()` and `Limits` for Python; the request values themselves cross in `raw.rs`,
//! and the validated request is `valid_request.rs`.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict};

use super::errors::{guard, int_arg};
use super::params::PySamplingParams;
use super::raw::raw_of;
use super::valid_request::PyValidRequest;
use crate::error::CoreError;
use crate::validate::{codes, max_prompt_tokens, validate_request, EndpointType, Limits, Route};

/// Server and model limits that requests are validated against; immutable.
#[pyclass(name = "Limits", module = "ferrollm._core", frozen, eq)]
#[derive(PartialEq)]
pub struct PyLimits {
    pub(crate) inner: Limits,
}

/// A non-negative integer argument that fits `u32`, as a ValidationError naming `param`
/// otherwise.
pub(crate) fn u32_arg(param: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<u32> {
    let rule = "an integer in [0, 4294967295]";
    if obj.is_instance_of::<PyBool>() {
        return Err(CoreError::invalid(
            param,
            codes::WRONG_TYPE,
            format!("`{param}` must be {rule}; got {obj}"),
        )
        .into());
    }
    let value = int_arg(param, rule, obj)?;
    u32::try_from(value).map_err(|_| {
        CoreError::invalid(
            param,
            codes::OUT_OF_RANGE,
            format!("`{param}` must be {rule}; got {value}"),
        )
        .into()
    })
}

/// Sets the limit `name` from a keyword argument; None keeps the default.
fn set_limit(l: &mut Limits, name: &str, v: &Bound<'_, PyAny>) -> PyResult<()> {
    if v.is_none() && name != "max_position_embeddings" && name != "databricks_endpoint_type" {
        return Ok(());
    }
    match name {
        "max_model_len" => l.max_model_len = u32_arg("max_model_len", v)?,
        "max_input_tokens" => l.max_input_tokens = u32_arg("max_input_tokens", v)?,
        "max_position_embeddings" => {
            l.max_position_embeddings = (!v.is_none())
                .then(|| u32_arg("max_position_embeddings", v))
                .transpose()?
        }
        "max_iter_times" => l.max_iter_times = u32_arg("max_iter_times", v)?,
        "vocab_size" => l.vocab_size = u32_arg("vocab_size", v)?,
        "max_prompt_chars" => l.max_prompt_chars = u32_arg("max_prompt_chars", v)?,
        "max_stop_chars" => l.max_stop_chars = u32_arg("max_stop_chars", v)?,
        "max_n" => l.max_n = u32_arg("max_n", v)?,
        "max_logprobs" => l.max_logprobs = u32_arg("max_logprobs", v)?,
        "max_tools_databricks" => l.max_tools_databricks = u32_arg("max_tools_databricks", v)?,
        "max_beam_width" => l.max_beam_width = u32_arg("max_beam_width", v)?,
        "embedding_dimensions" => l.embedding_dimensions = u32_arg("embedding_dimensions", v)?,
        "multimodal" => {
            l.multimodal = v
                .cast::<PyBool>()
                .map_err(|_| {
                    PyErr::from(CoreError::invalid(
                        "multimodal",
                        codes::WRONG_TYPE,
                        format!("`multimodal` must be a bool; got {v}"),
                    ))
                })?
                .is_true()
        }
        "databricks_endpoint_type" => {
            l.databricks_endpoint_type = if v.is_none() {
                None
            } else {
                Some(EndpointType::parse(&v.str()?.to_string_lossy())?)
            }
        }
        _ => {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "Limits() got an unexpected keyword argument '{name}'"
            )))
        }
    }
    Ok(())
}

#[pymethods]
impl PyLimits {
    #[new]
    #[pyo3(signature = (**kwargs), text_signature = "(*, max_model_len=8192, max_input_tokens=8192, max_position_embeddings=None, max_iter_times=8192, vocab_size=0, max_prompt_chars=4194304, max_stop_chars=32768, max_n=128, max_logprobs=20, max_tools_databricks=32, max_beam_width=128, multimodal=False, databricks_endpoint_type=None, embedding_dimensions=0)")]
    fn new(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let mut inner = Limits::default();
        if let Some(kwargs) = kwargs {
            for (key, value) in kwargs.iter() {
                set_limit(&mut inner, &key.extract::<String>()?, &value)?;
            }
        }
        inner.validate()?;
        Ok(PyLimits { inner })
    }

    #[getter]
    fn max_model_len(&self) -> u32 {
        self.inner.max_model_len
    }
    #[getter]
    fn max_input_tokens(&self) -> u32 {
        self.inner.max_input_tokens
    }
    #[getter]
    fn max_position_embeddings(&self) -> Option<u32> {
        self.inner.max_position_embeddings
    }
    #[getter]
    fn max_iter_times(&self) -> u32 {
        self.inner.max_iter_times
    }
    #[getter]
    fn vocab_size(&self) -> u32 {
        self.inner.vocab_size
    }
    #[getter]
    fn max_prompt_chars(&self) -> u32 {
        self.inner.max_prompt_chars
    }
    #[getter]
    fn max_stop_chars(&self) -> u32 {
        self.inner.max_stop_chars
    }
    #[getter]
    fn max_n(&self) -> u32 {
        self.inner.max_n
    }
    #[getter]
    fn max_logprobs(&self) -> u32 {
        self.inner.max_logprobs
    }
    #[getter]
    fn max_tools_databricks(&self) -> u32 {
        self.inner.max_tools_databricks
    }
    #[getter]
    fn max_beam_width(&self) -> u32 {
        self.inner.max_beam_width
    }
    #[getter]
    fn multimodal(&self) -> bool {
        self.inner.multimodal
    }
    #[getter]
    fn embedding_dimensions(&self) -> u32 {
        self.inner.embedding_dimensions
    }
    /// The most prompt tokens a request may have (docs/api/common.md#prompt-limits).
    #[getter]
    fn max_prompt_tokens(&self) -> u32 {
        max_prompt_tokens(&self.inner)
    }

    #[getter]
    fn databricks_endpoint_type(&self) -> Option<&'static str> {
        self.inner
            .databricks_endpoint_type
            .map(EndpointType::as_str)
    }

    fn __repr__(&self) -> String {
        let l = &self.inner;
        let opt = |v: Option<String>| v.unwrap_or_else(|| "None".to_string());
        format!(
            "Limits(max_model_len={}, max_input_tokens={}, max_position_embeddings={}, max_iter_times={}, vocab_size={}, max_prompt_chars={}, max_stop_chars={}, max_n={}, max_logprobs={}, max_tools_databricks={}, max_beam_width={}, multimodal={}, databricks_endpoint_type={}, embedding_dimensions={})",
            l.max_model_len,
            l.max_input_tokens,
            opt(l.max_position_embeddings.map(|p| p.to_string())),
            l.max_iter_times,
            l.vocab_size,
            l.max_prompt_chars,
            l.max_stop_chars,
            l.max_n,
            l.max_logprobs,
            l.max_tools_databricks,
            l.max_beam_width,
            if l.multimodal { "True" } else { "False" },
            opt(l.databricks_endpoint_type.map(|t| format!("'{}'", t.as_str()))),
            l.embedding_dimensions,
        )
    }
}

fn limits_or_default(limits: Option<PyRef<'_, PyLimits>>) -> Limits {
    limits.map_or_else(Limits::default, |l| l.inner.clone())
}

/// Validates a request body of `route` once (a parsed `Body`, or a Python value: the offline
/// and TRT requests) and returns the `ValidRequest`.
#[pyfunction]
#[pyo3(signature = (route, body, limits=None), text_signature = "(route, body, limits=None)")]
pub(crate) fn validate(
    py: Python<'_>,
    route: &str,
    body: &Bound<'_, PyAny>,
    limits: Option<PyRef<'_, PyLimits>>,
) -> PyResult<PyValidRequest> {
    let parsed = Route::parse(route)?;
    let raw = raw_of(body)?;
    let limits = limits_or_default(limits);
    // Without the GIL: a large body validated on a worker thread leaves the event loop free.
    let inner = py.detach(|| guard("validate", || validate_request(parsed, &raw, &limits)))??;
    let params = Py::new(
        py,
        PySamplingParams {
            inner: Arc::new(inner.params.clone()),
        },
    )?;
    Ok(PyValidRequest {
        route: route.to_owned(),
        inner,
        limits,
        body: raw,
        params,
    })
}
