//! `SamplingParams` for Python: immutable, validated on construction.

use std::sync::Arc;

use pyo3::prelude::*;

use super::errors::int_arg;
use crate::params::SamplingParams;
use crate::types::TokenId;

#[pyclass(name = "SamplingParams", module = "ferrollm._core", frozen, eq)]
#[derive(PartialEq)]
pub struct PySamplingParams {
    pub(crate) inner: Arc<SamplingParams>,
}

#[pymethods]
impl PySamplingParams {
    #[new]
    // Integers arrive as Python objects so that out-of-range ones get a ValidationError; None
    // means the default shown in the text signature.
    #[pyo3(signature = (*, n=None, max_tokens=None, min_tokens=None, ignore_eos=false, stop_token_ids=None),
        text_signature = "(*, n=1, max_tokens=None, min_tokens=0, ignore_eos=False, stop_token_ids=None)")]
    fn new(
        n: Option<&Bound<'_, PyAny>>,
        max_tokens: Option<&Bound<'_, PyAny>>,
        min_tokens: Option<&Bound<'_, PyAny>>,
        ignore_eos: bool,
        stop_token_ids: Option<Vec<TokenId>>,
    ) -> PyResult<Self> {
        let inner = SamplingParams::new(
            n.map_or(Ok(1), |n| int_arg("n", "an integer in [1, 128]", n))?,
            max_tokens
                .map(|m| int_arg("max_tokens", "a positive integer", m))
                .transpose()?,
            min_tokens.map_or(Ok(0), |m| {
                int_arg("min_tokens", "a non-negative integer", m)
            })?,
            ignore_eos,
            stop_token_ids.unwrap_or_default(),
        )?;
        Ok(PySamplingParams {
            inner: Arc::new(inner),
        })
    }

    #[getter]
    fn n(&self) -> u32 {
        self.inner.n
    }

    #[getter]
    fn max_tokens(&self) -> Option<u32> {
        self.inner.max_tokens
    }

    #[getter]
    fn min_tokens(&self) -> u32 {
        self.inner.min_tokens
    }

    #[getter]
    fn ignore_eos(&self) -> bool {
        self.inner.ignore_eos
    }

    #[getter]
    fn stop_token_ids(&self) -> Vec<TokenId> {
        self.inner.stop_token_ids.clone()
    }

    fn __repr__(&self) -> String {
        let p = &self.inner;
        let max_tokens = p.max_tokens.map_or("None".to_string(), |m| m.to_string());
        let ignore_eos = if p.ignore_eos { "True" } else { "False" };
        format!(
            "SamplingParams(n={}, max_tokens={max_tokens}, min_tokens={}, ignore_eos={ignore_eos}, stop_token_ids={:?})",
            p.n, p.min_tokens, p.stop_token_ids
        )
    }
}
