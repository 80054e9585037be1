//! `StopMatcher` and `truncate_at_stop` for Python: the stop-string matcher of one sequence, fed
//! text deltas, and the same rule applied to a whole text.

use std::sync::Arc;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyString;

use super::errors::guard;
use crate::stop::{check_non_empty, truncate_at_stop, StopMatcher, StopStrings};

/// A mutable pyclass (not frozen, unlike the others): a matcher is one sequence's stream state.
#[pyclass(name = "StopMatcher", module = "ferrollm._core")]
pub struct PyStopMatcher {
    inner: StopMatcher,
    /// Reused output buffer, so a push allocates only the Python string it returns.
    out: String,
}

#[pymethods]
impl PyStopMatcher {
    #[new]
    #[pyo3(signature = (stop, include_stop_str_in_output=false),
        text_signature = "(stop, include_stop_str_in_output=False)")]
    fn new(stop: Vec<String>, include_stop_str_in_output: bool) -> PyResult<Self> {
        let stops = if stop.is_empty() {
            None
        } else {
            Some(Arc::new(guard("StopStrings", || StopStrings::new(&stop))??))
        };
        Ok(PyStopMatcher {
            inner: StopMatcher::new(stops, include_stop_str_in_output),
            out: String::new(),
        })
    }

    /// Returns `(text safe to emit, matched stop string or None)`.
    fn push<'py>(
        &mut self,
        delta: &Bound<'py, PyString>,
    ) -> PyResult<(Bound<'py, PyString>, Option<Bound<'py, PyString>>)> {
        let py = delta.py();
        let text = delta.to_str()?;
        let held_before = self.inner.held_len();
        self.out.clear();
        let matched = guard("StopMatcher.push", || self.inner.push(text, &mut self.out))?;
        // Emitted text is a prefix of `held + delta`; with nothing held before, equal length
        // means it is the delta itself, which is handed back without a copy (the common case).
        let emitted = if held_before == 0 && self.out.len() == text.len() {
            delta.clone()
        } else if self.out.is_empty() {
            intern!(py, "").clone()
        } else {
            PyString::new(py, &self.out)
        };
        let stop = matched.and_then(|i| {
            let stops = self.inner.stops()?;
            Some(PyString::new(py, &stops.as_slice()[i]))
        });
        Ok((emitted, stop))
    }

    /// Returns the held-back tail: the text has ended, so no stop can complete any more.
    fn finish(&mut self) -> String {
        let mut out = String::new();
        self.inner.finish(&mut out);
        out
    }

    #[getter]
    fn stopped(&self) -> bool {
        self.inner.is_stopped()
    }

    #[getter]
    fn held(&self) -> &str {
        self.inner.held()
    }

    fn __repr__(&self) -> String {
        let stop = self.inner.stops().map_or(&[][..], |s| s.as_slice());
        format!(
            "StopMatcher(stop={stop:?}, stopped={}, held={:?})",
            if self.inner.is_stopped() {
                "True"
            } else {
                "False"
            },
            self.inner.held()
        )
    }
}

/// The non-streamed result of the stop rule: `(text, matched stop string or None)`.
#[pyfunction(name = "truncate_at_stop")]
#[pyo3(signature = (text, stop, include_stop_str_in_output=false),
    text_signature = "(text, stop, include_stop_str_in_output=False)")]
pub fn py_truncate_at_stop(
    py: Python<'_>,
    text: &str,
    stop: Vec<String>,
    include_stop_str_in_output: bool,
) -> PyResult<(String, Option<String>)> {
    check_non_empty(&stop)?;
    // Scales with the text: release the GIL.
    let (out, matched) = py.detach(|| {
        guard("truncate_at_stop", || {
            truncate_at_stop(text, &stop, include_stop_str_in_output)
        })
    })?;
    Ok((out, matched.map(|i| stop[i].clone())))
}
