//! `SamplingParams` for Python: immutable, validated on construction by the core's offline
//! route (vLLM-style keyword arguments named after the Rust fields).

use std::sync::Arc;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt};

use super::raw::member_to_raw;
use crate::params::{EarlyStopping, SamplingParams};
use crate::types::TokenId;
use crate::validate::{validate, Limits, Raw, Route, OFFLINE_FIELDS};

#[pyclass(name = "SamplingParams", module = "ferrollm._core", frozen, eq)]
#[derive(PartialEq)]
pub struct PySamplingParams {
    pub(crate) inner: Arc<SamplingParams>,
}

/// `logit_bias` keys arrive as Python ints; the core reads JSON-style decimal string keys.
fn logit_bias_keys_to_str<'py>(value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let Ok(dict) = value.cast::<PyDict>() else {
        return Ok(value.clone());
    };
    let out = PyDict::new(value.py());
    for (k, v) in dict.iter() {
        if k.is_instance_of::<PyInt>() && !k.is_instance_of::<PyBool>() {
            out.set_item(k.str()?, v)?;
        } else {
            out.set_item(k, v)?;
        }
    }
    Ok(out.into_any())
}

/// Python literal spelling of an optional value.
fn py_opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "None".to_string(), |v| v.to_string())
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

#[pymethods]
impl PySamplingParams {
    #[new]
    // Keyword arguments go through the core's offline route, so Python and HTTP requests share
    // one set of rules; None for any of them means its default.
    #[pyo3(signature = (**kwargs), text_signature = "(*, n=1, best_of=None, use_beam_search=False, length_penalty=1.0, early_stopping=False, max_tokens=None, min_tokens=0, ignore_eos=False, stop_token_ids=None, priority=5, timeout_s=None, stop=None, stop_token_sequences=None, include_stop_str_in_output=False, skip_special_tokens=True, spaces_between_special_tokens=True, logit_bias=None, embedding_bias=None, allowed_token_ids=None, bad_words=None, no_repeat_ngram_size=0, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, seed=None, logprobs=None, prompt_logprobs=None)")]
    fn new(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let mut entries = Vec::new();
        if let Some(kwargs) = kwargs {
            for (key, value) in kwargs.iter() {
                let name: String = key.extract()?;
                if !OFFLINE_FIELDS.contains(&name.as_str()) {
                    return Err(PyTypeError::new_err(format!(
                        "SamplingParams() got an unexpected keyword argument '{name}'"
                    )));
                }
                let value = if name == "logit_bias" {
                    logit_bias_keys_to_str(&value)?
                } else {
                    value
                };
                let raw = member_to_raw(&name, &value)?;
                entries.push((name, raw));
            }
        }
        let inner = validate(Route::Offline, &Raw::Map(entries), None, &Limits::default())?;
        Ok(PySamplingParams {
            inner: Arc::new(inner),
        })
    }

    /// A copy that keeps special tokens in the output text (a tool-call parser reading a
    /// marker that is a special token, such as Mistral's `[TOOL_CALLS]`, needs them).
    fn keeping_special_tokens(&self) -> Self {
        let mut inner = (*self.inner).clone();
        inner.skip_special_tokens = false;
        PySamplingParams {
            inner: Arc::new(inner),
        }
    }

    #[getter]
    fn n(&self) -> u32 {
        self.inner.n
    }
    #[getter]
    fn best_of(&self) -> u32 {
        self.inner.best_of
    }
    #[getter]
    fn use_beam_search(&self) -> bool {
        self.inner.use_beam_search
    }
    #[getter]
    fn length_penalty(&self) -> f32 {
        self.inner.length_penalty
    }
    /// `False`, `True` or `"never"`, as HF transformers spells it.
    #[getter]
    fn early_stopping<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self.inner.early_stopping {
            EarlyStopping::Heuristic => PyBool::new(py, false).to_owned().into_any(),
            EarlyStopping::Finished => PyBool::new(py, true).to_owned().into_any(),
            EarlyStopping::Never => "never".into_pyobject(py)?.into_any(),
        })
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
    #[getter]
    fn priority(&self) -> u8 {
        self.inner.priority
    }
    #[getter]
    fn timeout_s(&self) -> Option<f64> {
        self.inner.timeout_s
    }
    #[getter]
    fn stop(&self) -> Vec<String> {
        self.inner.stop.clone()
    }
    #[getter]
    fn stop_token_sequences(&self) -> Vec<Vec<TokenId>> {
        self.inner.stop_token_sequences.clone()
    }
    #[getter]
    fn include_stop_str_in_output(&self) -> bool {
        self.inner.include_stop_str_in_output
    }
    #[getter]
    fn skip_special_tokens(&self) -> bool {
        self.inner.skip_special_tokens
    }
    #[getter]
    fn spaces_between_special_tokens(&self) -> bool {
        self.inner.spaces_between_special_tokens
    }
    /// `{token_id: bias}` in id order.
    #[getter]
    fn logit_bias<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for &(id, bias) in &self.inner.logit_bias {
            out.set_item(id, bias)?;
        }
        Ok(out)
    }
    #[getter]
    fn embedding_bias(&self) -> Option<Vec<f32>> {
        self.inner.embedding_bias.as_deref().map(<[f32]>::to_vec)
    }
    #[getter]
    fn allowed_token_ids(&self) -> Option<Vec<TokenId>> {
        self.inner.allowed_token_ids.clone()
    }
    #[getter]
    fn bad_words(&self) -> Vec<Vec<TokenId>> {
        self.inner.bad_words.clone()
    }
    #[getter]
    fn no_repeat_ngram_size(&self) -> u32 {
        self.inner.no_repeat_ngram_size
    }
    #[getter]
    fn repetition_penalty(&self) -> f32 {
        self.inner.repetition_penalty
    }
    #[getter]
    fn presence_penalty(&self) -> f32 {
        self.inner.presence_penalty
    }
    #[getter]
    fn frequency_penalty(&self) -> f32 {
        self.inner.frequency_penalty
    }
    #[getter]
    fn temperature(&self) -> f32 {
        self.inner.temperature
    }
    #[getter]
    fn top_k(&self) -> u32 {
        self.inner.top_k
    }
    #[getter]
    fn top_p(&self) -> f32 {
        self.inner.top_p
    }
    #[getter]
    fn min_p(&self) -> f32 {
        self.inner.min_p
    }
    #[getter]
    fn typical_p(&self) -> f32 {
        self.inner.typical_p
    }
    #[getter]
    fn seed(&self) -> Option<u64> {
        self.inner.seed
    }
    #[getter]
    fn logprobs(&self) -> Option<u32> {
        self.inner.logprobs
    }
    #[getter]
    fn prompt_logprobs(&self) -> Option<u32> {
        self.inner.prompt_logprobs
    }

    fn __repr__(&self) -> String {
        let p = &self.inner;
        let debug = |v: &dyn std::fmt::Debug| format!("{v:?}");
        let logit_bias: Vec<String> = p
            .logit_bias
            .iter()
            .map(|(id, bias)| format!("{id}: {bias:?}"))
            .collect();
        let fields: [(&str, String); 32] = [
            ("n", p.n.to_string()),
            ("best_of", p.best_of.to_string()),
            ("use_beam_search", py_bool(p.use_beam_search).into()),
            ("length_penalty", debug(&p.length_penalty)),
            ("early_stopping", p.early_stopping.as_py().into()),
            ("max_tokens", py_opt(p.max_tokens)),
            ("min_tokens", p.min_tokens.to_string()),
            ("ignore_eos", py_bool(p.ignore_eos).into()),
            ("stop_token_ids", debug(&p.stop_token_ids)),
            ("priority", p.priority.to_string()),
            ("timeout_s", py_opt(p.timeout_s.map(|t| debug(&t)))),
            ("stop", debug(&p.stop)),
            ("stop_token_sequences", debug(&p.stop_token_sequences)),
            (
                "include_stop_str_in_output",
                py_bool(p.include_stop_str_in_output).into(),
            ),
            ("skip_special_tokens", py_bool(p.skip_special_tokens).into()),
            (
                "spaces_between_special_tokens",
                py_bool(p.spaces_between_special_tokens).into(),
            ),
            ("logit_bias", format!("{{{}}}", logit_bias.join(", "))),
            // A vocabulary-sized vector would drown the rest.
            (
                "embedding_bias",
                py_opt(
                    p.embedding_bias
                        .as_ref()
                        .map(|b| format!("<{} floats>", b.len())),
                ),
            ),
            (
                "allowed_token_ids",
                py_opt(p.allowed_token_ids.as_ref().map(|ids| debug(ids))),
            ),
            ("bad_words", debug(&p.bad_words)),
            ("no_repeat_ngram_size", p.no_repeat_ngram_size.to_string()),
            ("repetition_penalty", debug(&p.repetition_penalty)),
            ("presence_penalty", debug(&p.presence_penalty)),
            ("frequency_penalty", debug(&p.frequency_penalty)),
            ("temperature", debug(&p.temperature)),
            ("top_k", p.top_k.to_string()),
            ("top_p", debug(&p.top_p)),
            ("min_p", debug(&p.min_p)),
            ("typical_p", debug(&p.typical_p)),
            ("seed", py_opt(p.seed)),
            ("logprobs", py_opt(p.logprobs)),
            ("prompt_logprobs", py_opt(p.prompt_logprobs)),
        ];
        let fields: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("SamplingParams({})", fields.join(", "))
    }
}
