//! `validate()` and `Limits` for Python, and the one conversion of a Python object tree into
//! the core's `Raw` value (also used by the `SamplingParams` constructor).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyMapping, PyString, PyTuple};

use super::errors::{guard, int_arg};
use super::params::PySamplingParams;
use super::tokens::extract_token_ids;
use crate::error::CoreError;
use crate::validate::{
    check_capabilities, check_input_tokens, check_request, codes, max_prompt_tokens,
    validate_request, EndpointType, Limits, Raw, Route, ValidRequest, BUILT,
};

/// Deepest nesting accepted in a body; real request bodies are a few levels deep, and the
/// limit keeps a hostile value from exhausting the stack.
const MAX_DEPTH: usize = 64;

/// One step of the path to a value, for error messages.
enum Seg {
    Key(String),
    Index(usize),
}

/// Formats a path the way `validate` names fields (`messages[0].content`).
fn path_string(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) if out.is_empty() => out.push_str(k),
            Seg::Key(k) => {
                out.push('.');
                out.push_str(k);
            }
            Seg::Index(i) if out.is_empty() => out.push_str(&format!("body[{i}]")),
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    if out.is_empty() {
        out.push_str("body");
    }
    out
}

fn bad_value(path: &[Seg], code: &'static str, rule: String) -> PyErr {
    let param = path_string(path);
    let message = format!("`{param}` {rule}");
    CoreError::invalid(param, code, message).into()
}

/// Converts a Python value: None, bool (checked before int, as bool is an int subclass), int
/// (exact, up to 2^127), float, str, dict (str keys), list or tuple, numpy arrays and scalars
/// (through `tolist()` / `item()`), and other mappings. Anything else is a ValidationError
/// naming the path.
fn to_raw(obj: &Bound<'_, PyAny>, path: &mut Vec<Seg>) -> PyResult<Raw> {
    if path.len() > MAX_DEPTH {
        let rule = format!("is nested more than {MAX_DEPTH} levels deep");
        return Err(bad_value(path, codes::INVALID_FORMAT, rule));
    }
    if obj.is_none() {
        return Ok(Raw::Null);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Raw::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        return obj.extract::<i128>().map(Raw::Int).map_err(|_| {
            let rule = format!("is an integer too large to be exact here; got {obj}");
            bad_value(path, codes::OUT_OF_RANGE, rule)
        });
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(Raw::Float(f.value()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Raw::Str(s.to_str()?.to_owned()));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        return map_to_raw(d.iter(), path);
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let mut items = Vec::with_capacity(obj.len()?);
        for (i, item) in obj.try_iter()?.enumerate() {
            path.push(Seg::Index(i));
            items.push(to_raw(&item?, path)?);
            path.pop();
        }
        return Ok(Raw::List(items));
    }
    if is_numpy(obj)? {
        let method = if obj.hasattr("tolist")? && obj.hasattr("shape")? {
            "tolist"
        } else {
            "item"
        };
        return to_raw(&obj.call_method0(method)?, path);
    }
    if let Ok(m) = obj.cast::<PyMapping>() {
        let items = m.items()?;
        let pairs: Vec<_> = items
            .iter()
            .map(|kv| kv.extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>())
            .collect::<PyResult<_>>()?;
        return map_to_raw(pairs.into_iter(), path);
    }
    let type_name = obj.get_type().name()?;
    let rule =
        format!("must be None, a bool, int, float, str, list or dict; got a {type_name} object");
    Err(bad_value(path, codes::WRONG_TYPE, rule))
}

/// A numpy array or scalar (its type lives in the `numpy` module).
fn is_numpy(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let module = obj.get_type().module()?;
    Ok(module.to_str()?.split('.').next() == Some("numpy"))
}

fn map_to_raw<'py>(
    entries: impl Iterator<Item = (Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    path: &mut Vec<Seg>,
) -> PyResult<Raw> {
    let mut out = Vec::new();
    for (key, value) in entries {
        let Ok(key) = key.cast::<PyString>() else {
            let rule = format!("must have string keys; got the key {key}");
            return Err(bad_value(path, codes::WRONG_TYPE, rule));
        };
        let key = key.to_str()?.to_owned();
        path.push(Seg::Key(key.clone()));
        let value = to_raw(&value, path)?;
        path.pop();
        out.push((key, value));
    }
    Ok(Raw::Map(out))
}

/// Converts a top-level value (a request body or keyword arguments).
pub(crate) fn body_to_raw(obj: &Bound<'_, PyAny>) -> PyResult<Raw> {
    to_raw(obj, &mut Vec::new())
}

/// Converts the value of a top-level member `key` (a keyword argument), so that errors name
/// `key`.
pub(crate) fn member_to_raw(key: &str, obj: &Bound<'_, PyAny>) -> PyResult<Raw> {
    to_raw(obj, &mut vec![Seg::Key(key.to_string())])
}

/// Server and model limits that requests are validated against; immutable.
#[pyclass(name = "Limits", module = "ferrollm._core", frozen, eq)]
#[derive(PartialEq)]
pub struct PyLimits {
    pub(crate) inner: Limits,
}

/// A non-negative integer argument that fits `u32`, as a ValidationError naming `param`
/// otherwise.
fn u32_arg(param: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<u32> {
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
    /// The most prompt tokens a request may have (SPEC 1.4.2).
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

/// Validates the decoded request body of `route` once and returns the `ValidRequest`.
#[pyfunction]
#[pyo3(signature = (route, body, limits=None), text_signature = "(route, body, limits=None)")]
pub(crate) fn validate(
    route: &str,
    body: &Bound<'_, PyAny>,
    limits: Option<PyRef<'_, PyLimits>>,
) -> PyResult<PyValidRequest> {
    let parsed = Route::parse(route)?;
    let raw = body_to_raw(body)?;
    let limits = limits_or_default(limits);
    // Without the GIL: a large body validated on a worker thread leaves the event loop free.
    let inner = body
        .py()
        .detach(|| guard("validate", || validate_request(parsed, &raw, &limits)))??;
    let params = Py::new(
        body.py(),
        PySamplingParams {
            inner: Arc::new(inner.params.clone()),
        },
    )?;
    Ok(PyValidRequest {
        route: route.to_owned(),
        inner,
        limits,
        body: body.clone().unbind(),
        params,
    })
}

/// Refuses parameters that ask for a feature this build does not serve yet (the capability
/// table every request path shares).
#[pyfunction]
pub(crate) fn check_supported(params: PyRef<'_, PySamplingParams>) -> PyResult<()> {
    Ok(check_capabilities(&params.inner, &BUILT)?)
}

/// A request body that passed its route's rules: the parameters and every route switch.
#[pyclass(name = "ValidRequest", module = "ferrollm._core", frozen)]
pub struct PyValidRequest {
    route: String,
    inner: ValidRequest,
    limits: Limits,
    /// The decoded body the client sent: messages, tools and prompts are handed out from it
    /// as they are, never copied.
    body: Py<PyAny>,
    params: Py<PySamplingParams>,
}

impl PyValidRequest {
    fn member<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        let value = self.body.bind(py).get_item(key).ok();
        Ok(value.filter(|v| !v.is_none()))
    }
}

/// True for a prompt given as one list of token ids (its first item is an int), not a batch.
fn is_token_id_prompt(value: &Bound<'_, PyAny>) -> PyResult<bool> {
    let Ok(list) = value.cast::<PyList>() else {
        return Ok(false);
    };
    Ok(list.len() > 0 && list.get_item(0)?.is_instance_of::<PyInt>())
}

/// The text of `text_input`: a string, or its text parts joined in order (→A-46).
fn joined_text(value: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = value.cast::<PyString>() {
        return Ok(s.to_str()?.to_owned());
    }
    let mut text = String::new();
    for part in value.try_iter()? {
        let part = part?;
        if part.get_item("type")?.extract::<String>().ok().as_deref() == Some("text") {
            text.push_str(part.get_item("text")?.cast::<PyString>()?.to_str()?);
        }
    }
    Ok(text)
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
        self.member(py, "messages")
    }
    /// The body's `tools` when it has any, else None.
    #[getter]
    fn tools<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        match self.inner.switches.has_tools {
            true => self.member(py, "tools"),
            false => Ok(None),
        }
    }
    #[getter]
    fn tool_choice<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.member(py, "tool_choice")
    }
    #[getter]
    fn response_format<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.member(py, "response_format")
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
            if let Some(value) = self.member(py, key)? {
                if value.is_instance_of::<PyString>() || is_token_id_prompt(&value)? {
                    return Ok(vec![value]);
                }
                return value.try_iter()?.collect();
            }
        }
        match self.member(py, "text_input")? {
            Some(v) => Ok(vec![PyString::new(py, &joined_text(&v)?).into_any()]),
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

    /// Raises a ValidationError (code "unsupported") naming the field that asks for a feature
    /// this build does not serve yet.
    fn check_supported(&self) -> PyResult<()> {
        Ok(check_request(&self.inner, &BUILT)?)
    }

    fn __repr__(&self) -> String {
        format!(
            "ValidRequest(route={:?}, params={:?})",
            self.route, self.inner.params
        )
    }
}
