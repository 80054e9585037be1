//! Token ids from Python: a 1-D numpy array of any integer dtype (read in place when
//! contiguous) or a sequence of ints, narrowed to `TokenId` with errors naming the argument.

use numpy::{Element, PyArrayMethods, PyReadonlyArray1, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::error::CoreError;
use crate::types::TokenId;

fn bad_tokens(param: &'static str, detail: &str) -> CoreError {
    CoreError::invalid(
        param,
        "invalid_token_ids",
        format!("`{param}` must be a 1-D sequence of token ids in [0, 2^32); {detail}"),
    )
}

fn narrow<T: Copy + TryInto<TokenId>>(
    param: &'static str,
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

fn slice_of<'py, T: Element + Copy + TryInto<TokenId>>(
    param: &'static str,
    obj: &Bound<'py, PyAny>,
) -> Option<Result<Vec<TokenId>, CoreError>> {
    let array: PyReadonlyArray1<'py, T> = obj.extract().ok()?;
    Some(match array.as_slice() {
        Ok(values) => narrow(param, values),
        Err(_) => narrow(param, &array.to_vec().ok()?),
    })
}

/// Token ids from a 1-D numpy integer array (any integer dtype) or a sequence of ints.
pub(crate) fn extract_token_ids(
    param: &'static str,
    obj: &Bound<'_, PyAny>,
) -> PyResult<Vec<TokenId>> {
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        if array.ndim() != 1 {
            return Err(bad_tokens(
                param,
                &format!("got an array of {} dimensions", array.ndim()),
            )
            .into());
        }
        let found = slice_of::<u32>(param, obj)
            .or_else(|| slice_of::<i64>(param, obj))
            .or_else(|| slice_of::<i32>(param, obj))
            .or_else(|| slice_of::<u64>(param, obj))
            .or_else(|| slice_of::<i16>(param, obj))
            .or_else(|| slice_of::<u16>(param, obj))
            .or_else(|| slice_of::<u8>(param, obj));
        return match found {
            Some(result) => Ok(result?),
            None => Err(bad_tokens(param, &format!("got dtype {}", array.dtype())).into()),
        };
    }
    let values: Vec<i64> = obj
        .extract()
        .map_err(|_| PyErr::from(bad_tokens(param, "got something else")))?;
    Ok(narrow(param, &values)?)
}
