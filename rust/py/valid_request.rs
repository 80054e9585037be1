//! `ValidRequest` for Python: the switches and parameters of one validated body, and its
//! messages, tools and prompts handed out from the validated value.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

use super::params::PySamplingParams;
use super::raw::raw_to_py;
use super::tokens::extract_token_ids;
use super::validate::u32_arg;
use crate::validate::{
    check_input_tokens, joined_text, template_messages, Limits, Raw, ValidRequest,
};

/// A request body that passed its route's rules: the parameters and every route switch.
#[pyclass(name = "ValidRequest", module = "ferrollm._core", frozen)]
pub struct PyValidRequest {
    pub(crate) route: String,
    pub(crate) inner: ValidRequest,
    pub(crate) limits: Limits,
    /// The validated body: messages, tools and prompts are handed out from it (the client's
    /// bytes were walked once, by `Body.parse`).
    pub(crate) body: Arc<Raw>,
    pub(crate) params: Py<PySamplingParams>,
}

impl PyValidRequest {
    /// Member `key` of the body, unless absent or null.
    fn member(&self, key: &str) -> Option<&Raw> {
        self.body.get(key).filter(|v| !matches!(v, Raw::Null))
    }

    fn member_py<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.member(key).map(|v| raw_to_py(py, v)).transpose()
    }
}

/// True for a prompt given as one list of token ids (its first item is an int), not a batch.
fn is_token_id_prompt(value: &Raw) -> bool {
    matches!(value, Raw::List(items) if matches!(items.first(), Some(Raw::Int(_))))
}

#[pymethods]
impl PyValidRequest {
    /// The route name it was validated for.
    #[getter]
    fn route(&self) -> &str {
        &self.route
    }
    /// The parameters before the prompt-token rules.
    #[getter]
    fn params(&self, py: Python<'_>) -> Py<PySamplingParams> {
        self.params.clone_ref(py)
    }
    #[getter]
    fn stream(&self) -> bool {
        self.inner.switches.stream
    }
    #[getter]
    fn model(&self) -> Option<&str> {
        self.inner.switches.model.as_deref()
    }
    #[getter]
    fn echo(&self) -> bool {
        self.inner.switches.echo
    }
    #[getter]
    fn suffix(&self) -> Option<&str> {
        self.inner.switches.suffix.as_deref()
    }
    #[getter]
    fn truncate(&self) -> bool {
        self.inner.switches.truncate
    }
    #[getter]
    fn details(&self) -> bool {
        self.inner.switches.details
    }
    #[getter]
    fn client_id(&self) -> Option<&str> {
        self.inner.switches.client_id.as_deref()
    }
    #[getter]
    fn is_batch(&self) -> bool {
        self.inner.switches.is_batch
    }
    #[getter]
    fn score_only(&self) -> bool {
        self.inner.switches.score_only
    }
    #[getter]
    fn prompt_logprobs(&self) -> Option<u32> {
        self.inner.switches.prompt_logprobs
    }
    /// Structured output: `(kind, text, field)` of the grammar the output must follow
    /// (`GrammarCompiler.compile`'s arguments), or None.
    #[getter]
    fn grammar(&self) -> Option<(&'static str, String, String)> {
        self.inner
            .switches
            .grammar
            .as_ref()
            .map(|g| (g.kind.as_str(), g.text.clone(), g.field.clone()))
    }
    /// The chat messages as the client sent them (validated), or None.
    #[getter]
    fn messages<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.member_py(py, "messages")
    }
    /// The chat messages as the template renders them: content parts joined into text,
    /// `name` and `tool_call_id` when given, tool-call arguments as objects (empty for a
    /// request without messages).
    #[getter]
    fn template_messages<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        if let Some(Raw::List(messages)) = self.member("messages") {
            for message in template_messages(messages) {
                list.append(raw_to_py(py, &message)?)?;
            }
        }
        Ok(list)
    }
    /// The body's `tools` when it has any, else None.
    #[getter]
    fn tools<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        match self.inner.switches.has_tools {
            true => self.member_py(py, "tools"),
            false => Ok(None),
        }
    }
    #[getter]
    fn tool_choice<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.member_py(py, "tool_choice")
    }
    #[getter]
    fn response_format<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.member_py(py, "response_format")
    }
    /// vLLM's `chat_template_kwargs` (an object: keyword arguments for the chat template),
    /// or None.
    #[getter]
    fn chat_template_kwargs<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.member_py(py, "chat_template_kwargs")
    }
    /// Databricks embeddings `instruction` (prepended to every input), or None.
    #[getter]
    fn instruction(&self) -> Option<&str> {
        match self.member("instruction") {
            Some(Raw::Str(s)) => Some(s),
            _ => None,
        }
    }
    /// `/v1/embeddings` `encoding_format`: "float" or "base64".
    #[getter]
    fn encoding_format(&self) -> &'static str {
        if self.inner.switches.base64 {
            "base64"
        } else {
            "float"
        }
    }

    /// `/v1/embeddings` `truncate_prompt_tokens`, resolved (-1 is the model's maximum); None
    /// when not asked.
    #[getter]
    fn truncate_prompt_tokens(&self) -> Option<u32> {
        self.inner.switches.truncate_prompt_tokens
    }

    /// The token limits of an embeddings request once its inputs are tokenized (and cut):
    /// each input at most `max_input_tokens`, all together at most 300,000. Returns the total.
    fn check_input_tokens(&self, lengths: Vec<usize>) -> PyResult<u64> {
        Ok(check_input_tokens(
            self.inner.route,
            &lengths,
            &self.limits,
        )?)
    }

    /// The prompt texts: `prompt` or `input` (one, or a batch), or `text_input` with its text
    /// parts joined; empty for chat.
    #[getter]
    fn prompts<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        for key in ["prompt", "input"] {
            if let Some(value) = self.member(key) {
                return match value {
                    Raw::List(items) if !is_token_id_prompt(value) => {
                        items.iter().map(|item| raw_to_py(py, item)).collect()
                    }
                    one => Ok(vec![raw_to_py(py, one)?]),
                };
            }
        }
        match self.member("text_input") {
            Some(v) => Ok(vec![PyString::new(py, &joined_text(Some(v))).into_any()]),
            None => Ok(Vec::new()),
        }
    }

    /// The parameters for a prompt of `num_prompt_tokens` tokens: the prompt-token limit and
    /// the output cap (an error names `prompt[index]` in a batch).
    #[pyo3(signature = (num_prompt_tokens, index=None))]
    fn with_prompt_tokens(
        &self,
        num_prompt_tokens: &Bound<'_, PyAny>,
        index: Option<usize>,
    ) -> PyResult<PySamplingParams> {
        let num = u32_arg("num_prompt_tokens", num_prompt_tokens)?;
        let p = self
            .inner
            .with_prompt_tokens(Some(num), index, &self.limits)?;
        Ok(PySamplingParams { inner: Arc::new(p) })
    }

    /// Fits a tokenized prompt: cut from the left under `error_behavior: "truncate"`, then the
    /// limit and cap. Returns the prompt's token ids as a uint32 array and the parameters.
    #[pyo3(signature = (token_ids, index=None))]
    fn fit_prompt<'py>(
        &self,
        py: Python<'py>,
        token_ids: &Bound<'py, PyAny>,
        index: Option<usize>,
    ) -> PyResult<(Bound<'py, numpy::PyArray1<u32>>, PySamplingParams)> {
        let ids = extract_token_ids("prompt_token_ids", token_ids)?;
        let (drop, p) = self.inner.fit_prompt(ids.len(), index, &self.limits)?;
        let ids = numpy::PyArray1::from_slice(py, &ids[drop..]);
        Ok((ids, PySamplingParams { inner: Arc::new(p) }))
    }

    fn __repr__(&self) -> String {
        format!(
            "ValidRequest(route={:?}, params={:?})",
            self.route, self.inner.params
        )
    }
}
