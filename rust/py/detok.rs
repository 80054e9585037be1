//! `Detokenizer` and `DecodeStream` for Python. The Rust `Detokenizer` sits in an `Arc` so the
//! scheduler binding can share it with its sequences.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::errors::guard;
use super::tokens::extract_token_ids;
use crate::detok::{DecodeStream, Detokenizer};
use crate::error::CoreError;
use crate::types::TokenId;

/// Streams pushed at least this many ids at once release the GIL while decoding.
const DETACH_AT: usize = 256;

/// A token id from a Python int; anything else, or out of [0, 2^32), names `token_id`.
fn token_id_arg(obj: &Bound<'_, PyAny>) -> PyResult<TokenId> {
    obj.extract::<TokenId>().map_err(|_| {
        let msg = format!("`token_id` must be an integer in [0, 2^32); got {obj}");
        CoreError::invalid("token_id", "out_of_range", msg).into()
    })
}

#[pyclass(name = "Detokenizer", module = "ferrollm._core", frozen)]
pub struct PyDetokenizer {
    pub(crate) inner: Arc<Detokenizer>,
}

#[pymethods]
impl PyDetokenizer {
    #[staticmethod]
    #[pyo3(text_signature = "(path)")]
    fn from_file(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let loaded = py.detach(|| guard("Detokenizer.from_file", || Detokenizer::from_file(&path)));
        Ok(PyDetokenizer {
            inner: Arc::new(loaded??),
        })
    }

    #[staticmethod]
    #[pyo3(text_signature = "(json)")]
    fn from_str(py: Python<'_>, json: &str) -> PyResult<Self> {
        let loaded = py.detach(|| guard("Detokenizer.from_str", || Detokenizer::from_json(json)));
        Ok(PyDetokenizer {
            inner: Arc::new(loaded??),
        })
    }

    #[pyo3(signature = (token_ids, skip_special_tokens=true, spaces_between_special_tokens=true))]
    fn decode(
        &self,
        py: Python<'_>,
        token_ids: &Bound<'_, PyAny>,
        skip_special_tokens: bool,
        spaces_between_special_tokens: bool,
    ) -> PyResult<String> {
        let ids = extract_token_ids("token_ids", token_ids)?;
        let det = &self.inner;
        py.detach(|| {
            guard("Detokenizer.decode", || {
                det.decode(&ids, skip_special_tokens, spaces_between_special_tokens)
            })
        })
    }

    #[pyo3(signature = (text, add_special_tokens=false))]
    fn encode(
        &self,
        py: Python<'_>,
        text: &str,
        add_special_tokens: bool,
    ) -> PyResult<Vec<TokenId>> {
        let det = &self.inner;
        let ids = py.detach(|| {
            guard("Detokenizer.encode", || {
                det.encode(text, add_special_tokens)
            })
        });
        Ok(ids??)
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    #[getter]
    fn has_fast_path(&self) -> bool {
        self.inner.has_fast_path()
    }

    fn is_special(&self, token_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(self.inner.is_special(token_id_arg(token_id)?))
    }

    fn token_text(&self, token_id: &Bound<'_, PyAny>) -> PyResult<String> {
        let id = token_id_arg(token_id)?;
        guard("Detokenizer.token_text", || self.inner.token_text(id))
    }

    fn token_bytes<'py>(
        &self,
        py: Python<'py>,
        token_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let id = token_id_arg(token_id)?;
        let bytes = guard("Detokenizer.token_bytes", || self.inner.token_bytes(id))?;
        Ok(PyBytes::new(py, &bytes))
    }

    #[pyo3(signature = (skip_special_tokens=true, spaces_between_special_tokens=true))]
    fn stream(
        &self,
        skip_special_tokens: bool,
        spaces_between_special_tokens: bool,
    ) -> PyDecodeStream {
        PyDecodeStream {
            det: Arc::clone(&self.inner),
            inner: DecodeStream::new(skip_special_tokens, spaces_between_special_tokens),
        }
    }

    fn __repr__(&self) -> String {
        let fast = if self.inner.has_fast_path() {
            "True"
        } else {
            "False"
        };
        format!(
            "Detokenizer(vocab_size={}, has_fast_path={fast})",
            self.inner.vocab_size()
        )
    }
}

fn push_all(det: &Detokenizer, stream: &mut DecodeStream, ids: &[TokenId]) -> PyResult<String> {
    let mut out = String::new();
    guard("DecodeStream.push", || stream.push(det, ids, &mut out))?;
    Ok(out)
}

#[pyclass(name = "DecodeStream", module = "ferrollm._core")]
pub struct PyDecodeStream {
    det: Arc<Detokenizer>,
    inner: DecodeStream,
}

#[pymethods]
impl PyDecodeStream {
    fn step(&mut self, token_id: &Bound<'_, PyAny>) -> PyResult<String> {
        let id = token_id_arg(token_id)?;
        let mut out = String::new();
        guard("DecodeStream.step", || {
            self.inner.step(&self.det, id, &mut out)
        })?;
        Ok(out)
    }

    fn push(&mut self, py: Python<'_>, token_ids: &Bound<'_, PyAny>) -> PyResult<String> {
        let ids = extract_token_ids("token_ids", token_ids)?;
        let (det, stream) = (&self.det, &mut self.inner);
        if ids.len() >= DETACH_AT {
            py.detach(|| push_all(det, stream, &ids))
        } else {
            push_all(det, stream, &ids)
        }
    }

    fn finish(&mut self) -> PyResult<String> {
        let mut out = String::new();
        guard("DecodeStream.finish", || {
            self.inner.finish(&self.det, &mut out)
        })?;
        Ok(out)
    }
}
