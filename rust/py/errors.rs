//! CoreError -> Python exception, in one place. A panic inside the core is caught at the
//! boundary and becomes a SchedulerError instead of unwinding into the interpreter.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::error::CoreError;

create_exception!(
    _core,
    ValidationError,
    PyValueError,
    "A value broke a rule; `.param` names the field and `.code` the rule."
);
create_exception!(
    _core,
    QueueFullError,
    PyRuntimeError,
    "The waiting queue is full; retry later (HTTP 503)."
);
create_exception!(
    _core,
    SchedulerError,
    PyRuntimeError,
    "The scheduler was misused (a stale plan) or hit an internal error."
);

impl From<CoreError> for PyErr {
    fn from(err: CoreError) -> PyErr {
        match err {
            CoreError::Invalid {
                param,
                code,
                message,
            } => Python::attach(|py| {
                let err = ValidationError::new_err(message);
                let value = err.value(py);
                // Setting attributes on a fresh exception instance cannot fail in practice; if it
                // did, the message (which names the field) still reaches the caller.
                let _ = value.setattr("param", param);
                let _ = value.setattr("code", code);
                err
            }),
            CoreError::QueueFull { .. } => QueueFullError::new_err(err.to_string()),
            CoreError::StalePlan { .. } => SchedulerError::new_err(err.to_string()),
        }
    }
}

/// Runs `f`, turning a panic into a SchedulerError.
pub(crate) fn guard<T>(what: &str, f: impl FnOnce() -> T) -> PyResult<T> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|panic| {
        let detail = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("unknown panic");
        SchedulerError::new_err(format!("internal error in {what}: {detail}"))
    })
}

/// An integer argument as `i64`; a Python int beyond `i64` becomes a ValidationError naming
/// `param` (instead of an OverflowError), so the caller sees the field and the rule.
pub(crate) fn int_arg(param: &'static str, rule: &str, obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    obj.extract::<i64>().map_err(|_| {
        CoreError::invalid(
            param,
            "out_of_range",
            format!("`{param}` must be {rule}; got {obj}"),
        )
        .into()
    })
}
