//! `NewRequest` for Python: the one typed value both schedulers' `add_request` take, checked
//! for types on construction (the core checks its meaning when it is added).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use numpy::PyReadonlyArray2;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::args::Args;
use super::arrays::float32_array;
use super::errors::int_arg;
use super::grammar::PyCompiledGrammar;
use super::params::PySamplingParams;
use super::tokens::extract_token_ids;
use crate::error::CoreError;
use crate::params::SamplingParams;
use crate::sched::{MediaSpan, NewRequest};
use crate::types::RequestId;

/// Seconds since the epoch: the clock arrival times default to.
pub(crate) fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A request id: an integer in `[0, 2^64)`, else a ValidationError naming `request_id`.
pub(crate) fn request_id_arg(obj: &Bound<'_, PyAny>) -> PyResult<RequestId> {
    obj.extract::<u64>().map(RequestId).map_err(|_| {
        let msg = format!("`request_id` must be an integer in [0, 2^64); got {obj}");
        CoreError::invalid("request_id", "out_of_range", msg).into()
    })
}

/// `draft_logits` as a flat copy of its `[num_draft_tokens, vocab]` float32 values.
fn draft_logits_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<f32>> {
    float32_array("draft_logits", obj, 2)?;
    let array: PyReadonlyArray2<'_, f32> = obj.extract()?;
    Ok(array.as_array().iter().copied().collect())
}

/// The names `NewRequest(...)` binds, the first three positional.
const NAMES: &[&str] = &[
    "request_id",
    "prompt_token_ids",
    "params",
    "priority",
    "arrival_time",
    "deadline",
    "cache_salt",
    "grammar",
    "draft_tokens",
    "draft_logits",
    "num_virtual_tokens",
    "lora_id",
    "media",
];

#[pyclass(name = "NewRequest", module = "ferrollm._core", frozen)]
pub struct PyNewRequest {
    pub(crate) inner: NewRequest,
}

#[pymethods]
impl PyNewRequest {
    #[new]
    #[pyo3(signature = (*args, **kwargs),
        text_signature = "(request_id, prompt_token_ids, params=None, *, priority=None, arrival_time=None, deadline=None, cache_salt=None, grammar=None, draft_tokens=None, draft_logits=None, num_virtual_tokens=0, lora_id=0, media=None)")]
    fn new(args: &Bound<'_, PyTuple>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let a = Args::bind("NewRequest()", NAMES, 3, args, kwargs)?;
        let given = |name: &str| {
            a.get(name).ok_or_else(|| {
                PyTypeError::new_err(format!("NewRequest() missing required argument: '{name}'"))
            })
        };
        let params = a.extract::<PyRef<'_, PySamplingParams>>("params")?;
        let priority = a.get("priority");
        let inner = NewRequest {
            id: request_id_arg(given("request_id")?)?,
            prompt_token_ids: extract_token_ids("prompt_token_ids", given("prompt_token_ids")?)?,
            num_virtual_tokens: a.extract("num_virtual_tokens")?.unwrap_or(0),
            params: params.map_or_else(|| Arc::new(SamplingParams::default()), |p| p.inner.clone()),
            priority: priority
                .map(|p| int_arg("priority", "an integer in [1, 5]", p))
                .transpose()?,
            arrival_time: a.extract("arrival_time")?.unwrap_or_else(now),
            deadline: a.extract("deadline")?,
            cache_salt: a.extract("cache_salt")?,
            grammar: a
                .extract::<PyRef<'_, PyCompiledGrammar>>("grammar")?
                .map(|g| g.inner.clone()),
            draft_tokens: match a.get("draft_tokens") {
                Some(ids) => extract_token_ids("draft_tokens", ids)?,
                None => Vec::new(),
            },
            draft_logits: a.get("draft_logits").map(draft_logits_arg).transpose()?,
            lora_id: a.extract("lora_id")?.unwrap_or(0),
            media: a
                .extract::<Vec<(usize, usize, String)>>("media")?
                .map_or_else(Vec::new, |spans| {
                    spans
                        .into_iter()
                        .map(|(offset, length, digest)| MediaSpan {
                            offset,
                            length,
                            digest: digest.into(),
                        })
                        .collect()
                }),
        };
        Ok(PyNewRequest { inner })
    }

    /// The caller's id.
    #[getter]
    fn request_id(&self) -> u64 {
        self.inner.id.0
    }

    /// Tokens in the prompt.
    #[getter]
    fn num_prompt_tokens(&self) -> usize {
        self.inner.prompt_token_ids.len()
    }

    /// When the request arrived (seconds, the clock `schedule(now)` uses).
    #[getter]
    fn arrival_time(&self) -> f64 {
        self.inner.arrival_time
    }

    fn __repr__(&self) -> String {
        format!(
            "NewRequest(request_id={}, num_prompt_tokens={}, arrival_time={})",
            self.inner.id.0,
            self.inner.prompt_token_ids.len(),
            self.inner.arrival_time
        )
    }
}
