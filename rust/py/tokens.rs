//! Token ids from Python, in one place: a 1-D numpy array of any integer dtype or a sequence of
//! ints, narrowed to `TokenId` with errors naming the argument. A contiguous uint32 array is
//! borrowed in place for callers that only read ([`token_ids`]); [`extract_token_ids`] owns.

use numpy::{Element, PyReadonlyArray1, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::error::CoreError;
use crate::types::TokenId;

/// Token ids read from Python: a borrowed contiguous uint32 array, or converted ids.
pub(crate) enum TokenIds<'py> {
    View(PyReadonlyArray1<'py, u32>),
    Owned(Vec<TokenId>),
}

impl TokenIds<'_> {
    /// The ids.
    pub fn as_slice(&self) -> &[TokenId] {
        match self {
            // Only contiguous views are kept (see `token_ids`), so `as_slice` succeeds.
            TokenIds::View(a) => a.as_slice().unwrap_or(&[]),
            TokenIds::Owned(v) => v,
        }
    }

    /// The ids as an owned vector (a copy only for a borrowed view).
    pub fn into_vec(self) -> Vec<TokenId> {
        match self {
            TokenIds::View(a) => a.as_slice().map_or_else(|_| Vec::new(), <[u32]>::to_vec),
            TokenIds::Owned(v) => v,
        }
    }
}

fn bad_tokens(param: &str, detail: &str) -> CoreError {
    CoreError::invalid(
        param,
        "invalid_token_ids",
        format!("`{param}` must be a 1-D sequence of token ids in [0, 2^32); {detail}"),
    )
}

fn narrow<T: Copy + TryInto<TokenId>>(
    param: &str,
    values: &[T],
) -> Result<Vec<TokenId>, CoreError> {
    values
        .iter()
        .map(|&v| {
            v.try_into()
                .map_err(|_| bad_tokens(param, "got a value outside that range"))
        })
        .collect()
}

fn narrowed<'py, T: Element + Copy + TryInto<TokenId>>(
    param: &str,
    obj: &Bound<'py, PyAny>,
) -> Option<Result<Vec<TokenId>, CoreError>> {
    let array: PyReadonlyArray1<'py, T> = obj.extract().ok()?;
    Some(match array.as_slice() {
        Ok(values) => narrow(param, values),
        // A strided view is read element by element.
        Err(_) => narrow(param, &array.as_array().to_vec()),
    })
}

/// Token ids from a 1-D numpy integer array (any integer dtype) or a sequence of ints; a
/// contiguous uint32 array is borrowed, not copied.
pub(crate) fn token_ids<'py>(param: &str, obj: &Bound<'py, PyAny>) -> PyResult<TokenIds<'py>> {
    let Ok(array) = obj.cast::<PyUntypedArray>() else {
        let values: Vec<i64> = obj
            .extract()
            .map_err(|_| bad_tokens(param, &format!("got {}", obj.get_type())))?;
        return Ok(TokenIds::Owned(narrow(param, &values)?));
    };
    if array.ndim() != 1 {
        let detail = format!("got an array of {} dimensions", array.ndim());
        return Err(bad_tokens(param, &detail).into());
    }
    if let Ok(view) = obj.extract::<PyReadonlyArray1<'py, u32>>() {
        if view.as_slice().is_ok() {
            return Ok(TokenIds::View(view));
        }
    }
    let found = narrowed::<u32>(param, obj)
        .or_else(|| narrowed::<i64>(param, obj))
        .or_else(|| narrowed::<i32>(param, obj))
        .or_else(|| narrowed::<u64>(param, obj))
        .or_else(|| narrowed::<i16>(param, obj))
        .or_else(|| narrowed::<u16>(param, obj))
        .or_else(|| narrowed::<u8>(param, obj));
    match found {
        Some(result) => Ok(TokenIds::Owned(result?)),
        None => Err(bad_tokens(param, &format!("got dtype {}", array.dtype())).into()),
    }
}

/// Token ids as an owned vector (see [`token_ids`]).
pub(crate) fn extract_token_ids(param: &str, obj: &Bound<'_, PyAny>) -> PyResult<Vec<TokenId>> {
    Ok(token_ids(param, obj)?.into_vec())
}
