//! Stop strings and stop token ids (docs/api/common.md#stop-conditions), shared by the
//! OpenAI-style, Databricks and offline routes.

use crate::error::CoreResult;
use crate::types::TokenId;

use super::codes;
use super::common::I32_MAX;
use super::limits::Limits;
use super::raw::{Field, Raw};

/// `stop`: a string or a list of strings; each at least one character, all together at most
/// `max_stop_chars` characters (code points). `[]` and null mean no stop strings.
pub(crate) fn stop(f: Field<'_>, limits: &Limits) -> CoreResult<Vec<String>> {
    let budget = limits.max_stop_chars as usize;
    let items = match f.raw {
        None => return Ok(Vec::new()),
        Some(Raw::Str(s)) => {
            let chars = s.chars().count();
            if chars == 0 {
                return Err(f.bad(codes::EMPTY, "must be at least 1 character"));
            }
            if chars > budget {
                return Err(f.bad(
                    codes::TOO_LONG,
                    format_args!("must be at most {budget} characters (it has {chars})"),
                ));
            }
            return Ok(vec![s.clone()]);
        }
        Some(Raw::List(items)) => items,
        Some(_) => return Err(f.wrong_type("a string or a list of strings")),
    };
    let mut total = 0usize;
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let path = f.path.index(i);
        let item = Field::new(path, Some(item));
        let s = match item.raw {
            Some(Raw::Str(s)) => s,
            _ => return Err(item.wrong_type("a string")),
        };
        let chars = s.chars().count();
        if chars == 0 {
            return Err(item.bad(codes::EMPTY, "must be at least 1 character"));
        }
        total += chars;
        if total > budget {
            return Err(f.bad(
                codes::TOO_LONG,
                format_args!(
                    "must have at most {budget} characters in all; {total} by element {i}"
                ),
            ));
        }
        out.push(s.clone());
    }
    Ok(out)
}

/// `stop_token_ids` of the HTTP routes: a list of integers, none of them null (400). Ids that
/// can never be sampled are dropped without an error, as MindIE does for values outside int32:
/// negative ids, ids beyond int32, and ids at or above a known vocabulary size.
pub(crate) fn stop_token_ids_lenient(f: Field<'_>, limits: &Limits) -> CoreResult<Vec<TokenId>> {
    let Some(items) = f.list()? else {
        return Ok(Vec::new());
    };
    let top = if limits.vocab_size > 0 {
        i128::from(limits.vocab_size) - 1
    } else {
        I32_MAX
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let path = f.path.index(i);
        let item = Field::new(path, Some(item));
        let Some(id) = item.int()? else {
            return Err(item.wrong_type("an integer token id"));
        };
        if (0..=top.min(I32_MAX)).contains(&id) {
            out.push(id as TokenId);
        }
    }
    Ok(out)
}
