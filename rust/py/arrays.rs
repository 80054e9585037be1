//! numpy in and out, in one place: arrays built from Rust vectors (moved, not copied) and the
//! float32 logits borrowed in place (checked for dtype, shape and layout, so the hot path never
//! copies behind the caller's back).

use numpy::{
    Element, PyArray1, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray2, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;

use crate::error::CoreError;

/// A 1-D numpy array owned by Python.
pub(crate) type Arr<T> = Py<PyArray1<T>>;

/// `v` as a 1-D numpy array that owns its buffer.
pub(crate) fn arr<T: Element>(py: Python<'_>, v: Vec<T>) -> Arr<T> {
    PyArray1::from_vec(py, v).unbind()
}

/// Row-major `v` as a `[len / cols, cols]` array (`[0, 0]` when `cols` is 0).
pub(crate) fn arr2<T: Element>(py: Python<'_>, v: Vec<T>, cols: usize) -> PyResult<Py<PyAny>> {
    let rows = v.len().checked_div(cols).unwrap_or(0);
    arr_shaped(py, v, [rows, cols])
}

/// Row-major `v` as a 2-D array of `shape`.
pub(crate) fn arr_shaped<T: Element>(
    py: Python<'_>,
    v: Vec<T>,
    shape: [usize; 2],
) -> PyResult<Py<PyAny>> {
    Ok(PyArray1::from_vec(py, v)
        .reshape(shape)?
        .into_any()
        .unbind())
}

fn invalid(param: &str, code: &'static str, message: String) -> PyErr {
    CoreError::invalid(param, code, message).into()
}

/// Checks that `obj` is an `ndim`-D float32 numpy array, naming `param` otherwise.
pub(crate) fn float32_array(param: &str, obj: &Bound<'_, PyAny>, ndim: usize) -> PyResult<()> {
    let Ok(array) = obj.cast::<PyUntypedArray>() else {
        let msg = format!(
            "`{param}` must be a {ndim}-D float32 numpy array; got {}",
            obj.get_type()
        );
        return Err(invalid(param, "invalid_type", msg));
    };
    if array.ndim() != ndim {
        let msg = format!(
            "`{param}` must be {ndim}-D; got {} dimensions",
            array.ndim()
        );
        return Err(invalid(param, "bad_shape", msg));
    }
    if !array.dtype().is_equiv_to(&numpy::dtype::<f32>(obj.py())) {
        let msg = format!(
            "`{param}` must be float32; got {} (convert with `.astype(np.float32)`)",
            array.dtype()
        );
        return Err(invalid(param, "invalid_dtype", msg));
    }
    Ok(())
}

/// The `[rows, vocab]` logits, borrowed: a C-contiguous float32 array read in place.
pub(crate) fn logits_view<'py>(
    obj: &Bound<'py, PyAny>,
) -> PyResult<(PyReadonlyArray2<'py, f32>, usize)> {
    float32_array("logits", obj, 2)?;
    let array: PyReadonlyArray2<'py, f32> = obj.extract()?;
    if !array.is_c_contiguous() {
        let msg = "`logits` must be C-contiguous (rows of `vocab` adjacent values); \
                   use `np.ascontiguousarray(logits)`"
            .to_string();
        return Err(invalid("logits", "not_contiguous", msg));
    }
    let vocab = array.shape()[1];
    Ok((array, vocab))
}
