//! A call's arguments bound to their names as Python binds them, for the wrappers whose Python
//! signature is wider than a Rust function should be (a config or request with a dozen
//! keywords): the wrapper takes `*args, **kwargs`, binds them here, and reads one typed value
//! out of them. Its `text_signature` still shows the real signature.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// Arguments bound to names.
pub(crate) struct Args<'py> {
    /// The callable, for messages ("SchedulerConfig()", "Sampler.sample()").
    func: &'static str,
    names: &'static [&'static str],
    values: Vec<Option<Bound<'py, PyAny>>>,
}

impl<'py> Args<'py> {
    /// Binds `args` to the first `num_positional` of `names`, then `kwargs` by name. A
    /// TypeError, as Python raises it, for too many positional arguments, an unknown keyword
    /// or an argument given twice.
    pub fn bind(
        func: &'static str,
        names: &'static [&'static str],
        num_positional: usize,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Self> {
        if args.len() > num_positional {
            return Err(PyTypeError::new_err(format!(
                "{func} takes at most {num_positional} positional arguments ({} given)",
                args.len()
            )));
        }
        let mut values: Vec<Option<Bound<'py, PyAny>>> = vec![None; names.len()];
        for (value, arg) in values.iter_mut().zip(args.iter()) {
            *value = Some(arg);
        }
        for (key, value) in kwargs.into_iter().flat_map(|d| d.iter()) {
            let key: String = key.extract()?;
            let Some(i) = names.iter().position(|&n| n == key) else {
                return Err(PyTypeError::new_err(format!(
                    "{func} got an unexpected keyword argument '{key}'"
                )));
            };
            if values[i].replace(value).is_some() {
                return Err(PyTypeError::new_err(format!(
                    "{func} got multiple values for argument '{key}'"
                )));
            }
        }
        Ok(Args {
            func,
            names,
            values,
        })
    }

    /// The object bound to `name`; None when it was not given or is None.
    pub fn get(&self, name: &str) -> Option<&Bound<'py, PyAny>> {
        let i = self
            .names
            .iter()
            .position(|&n| n == name)
            .expect("a declared name");
        self.values[i].as_ref().filter(|v| !v.is_none())
    }

    /// `name`'s value as `T`; None when it was not given or is None. An extraction error is
    /// noted with the argument's name, as pyo3 does for its own arguments.
    pub fn extract<T>(&self, name: &str) -> PyResult<Option<T>>
    where
        T: for<'a> FromPyObject<'a, 'py>,
        for<'a> <T as FromPyObject<'a, 'py>>::Error: Into<PyErr>,
    {
        let Some(obj) = self.get(name) else {
            return Ok(None);
        };
        obj.extract::<T>().map(Some).map_err(|e| {
            let err: PyErr = e.into();
            let note = format!("while processing '{name}'");
            let _ = err.value(obj.py()).call_method1("add_note", (note,));
            err
        })
    }

    /// `name`'s value as `T`, which must be given.
    pub fn required<T>(&self, name: &str) -> PyResult<T>
    where
        T: for<'a> FromPyObject<'a, 'py>,
        for<'a> <T as FromPyObject<'a, 'py>>::Error: Into<PyErr>,
    {
        self.extract(name)?.ok_or_else(|| {
            PyTypeError::new_err(format!("{} missing required argument: '{name}'", self.func))
        })
    }
}
