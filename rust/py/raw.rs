//! Request values between Python and the core's `Raw`: a body's JSON bytes parsed once in
//! Rust (`Body.parse`: syntax, duplicate keys and depth in the same pass, without the GIL), a
//! Python object tree converted (the offline and TRT requests, tests), and validated parts
//! handed back to Python (`raw_to_py`). Every walk of a whole body is counted
//! (`_num_body_walks`), so a test can hold the server to one walk per request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyMapping, PyString, PyTuple};

use super::errors::guard;
use crate::error::CoreError;
use crate::validate::{
    codes, databricks_route as task_route, parse_body, path_string, too_deep, Raw, Seg, MAX_DEPTH,
};

/// Whole request bodies walked (parsed from bytes or converted from Python) since start-up.
static BODY_WALKS: AtomicU64 = AtomicU64::new(0);

/// How many whole request bodies were walked so far (a test's counter: one per request).
#[pyfunction]
pub(crate) fn _num_body_walks() -> u64 {
    BODY_WALKS.load(Ordering::Relaxed)
}

/// A request body parsed from its JSON bytes, ready for `validate` (opaque to Python).
#[pyclass(name = "Body", module = "ferrollm._core", frozen)]
pub struct PyBody {
    pub(crate) raw: Arc<Raw>,
}

#[pymethods]
impl PyBody {
    /// Parses `data` (the bytes of a JSON object) without the GIL; ValidationError for
    /// malformed JSON (code "invalid_json"), a non-object ("wrong_type"), a key repeated in
    /// one object ("duplicate_key", naming the key) or nesting past 64 levels.
    #[staticmethod]
    fn parse(py: Python<'_>, data: &Bound<'_, PyBytes>) -> PyResult<Self> {
        let bytes = data.as_bytes();
        BODY_WALKS.fetch_add(1, Ordering::Relaxed);
        let raw = py.detach(|| guard("Body.parse", || parse_body(bytes)))??;
        Ok(PyBody { raw: Arc::new(raw) })
    }

    /// The Databricks task the body asks for, by its shape: "databricks_chat",
    /// "databricks_completions" or "databricks_embeddings"; ValidationError unless exactly
    /// one of `messages`, `prompt` and `input` is given.
    fn databricks_route(&self) -> PyResult<&'static str> {
        Ok(task_route(&self.raw)?.name())
    }
}

/// The `Raw` of a `validate` argument: a parsed `Body` as it is, else a Python value converted.
pub(crate) fn raw_of(body: &Bound<'_, PyAny>) -> PyResult<Arc<Raw>> {
    match body.cast::<PyBody>() {
        Ok(parsed) => Ok(parsed.get().raw.clone()),
        Err(_) => Ok(Arc::new(body_to_raw(body)?)),
    }
}

/// A validated value as a Python object: None, bool, int, float, str, list or dict (in order).
pub(crate) fn raw_to_py<'py>(py: Python<'py>, raw: &Raw) -> PyResult<Bound<'py, PyAny>> {
    Ok(match raw {
        Raw::Null => py.None().into_bound(py),
        Raw::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Raw::Int(i) => i.into_pyobject(py)?.into_any(),
        Raw::Float(x) => PyFloat::new(py, *x).into_any(),
        Raw::Str(s) => PyString::new(py, s).into_any(),
        Raw::List(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(raw_to_py(py, item)?)?;
            }
            list.into_any()
        }
        Raw::Map(entries) => {
            let dict = PyDict::new(py);
            for (key, value) in entries {
                dict.set_item(key, raw_to_py(py, value)?)?;
            }
            dict.into_any()
        }
    })
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
        return Err(too_deep(path).into());
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

/// Converts a top-level value (a request body or keyword arguments): one walk, counted.
pub(crate) fn body_to_raw(obj: &Bound<'_, PyAny>) -> PyResult<Raw> {
    BODY_WALKS.fetch_add(1, Ordering::Relaxed);
    to_raw(obj, &mut Vec::new())
}

/// Converts the value of a top-level member `key` (a keyword argument), so that errors name
/// `key`.
pub(crate) fn member_to_raw(key: &str, obj: &Bound<'_, PyAny>) -> PyResult<Raw> {
    to_raw(obj, &mut vec![Seg::Key(key.to_string())])
}
