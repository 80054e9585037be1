//! Fields made of token ids (strict: a bad id is an error here, unlike the lenient HTTP
//! `stop_token_ids`), the vLLM extras the `/v1` routes accept with vLLM ranges, and the
//! `min_tokens <= max_tokens` rule.

use std::sync::Arc;

use crate::error::CoreResult;
use crate::params::SamplingParams;
use crate::types::TokenId;

use super::codes;
use super::common::{float_in, u32_in, BIAS, UNIT};
use super::limits::Limits;
use super::raw::{Field, Obj, Raw};

/// The largest valid token id: below a known vocabulary, else anything a `u32` holds.
fn max_token_id(limits: &Limits) -> i128 {
    if limits.vocab_size > 0 {
        i128::from(limits.vocab_size) - 1
    } else {
        i128::from(TokenId::MAX)
    }
}

/// One token id in `[0, vocab_size)` (or `[0, 2^32)` when the vocabulary is unknown).
pub(crate) fn token_id(f: Field<'_>, limits: &Limits) -> CoreResult<TokenId> {
    let top = max_token_id(limits);
    match f.int()? {
        None => Err(f.wrong_type("an integer token id")),
        Some(id) if (0..=top).contains(&id) => Ok(id as TokenId),
        Some(_) => Err(f.bad(
            codes::OUT_OF_RANGE,
            format_args!("must be a token id in [0, {}]", top),
        )),
    }
}

/// A list of token ids, each checked by [`token_id`]; `non_empty` rejects `[]`.
pub(crate) fn token_ids(
    f: Field<'_>,
    limits: &Limits,
    non_empty: bool,
) -> CoreResult<Option<Vec<TokenId>>> {
    let Some(items) = f.list()? else {
        return Ok(None);
    };
    if non_empty && items.is_empty() {
        return Err(f.bad(codes::EMPTY, "must not be empty"));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        out.push(token_id(Field::new(f.path.index(i), Some(item)), limits)?);
    }
    Ok(Some(out))
}

/// A list of non-empty token-id lists (`bad_words`, `stop_token_sequences`).
pub(crate) fn token_id_lists(f: Field<'_>, limits: &Limits) -> CoreResult<Vec<Vec<TokenId>>> {
    let Some(items) = f.list()? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let path = f.path.index(i);
        let item = Field::new(path, Some(item));
        if !item.is_set() {
            return Err(item.wrong_type("a list of token ids"));
        }
        out.push(token_ids(item, limits, true)?.unwrap_or_default());
    }
    Ok(out)
}

/// `allowed_token_ids`: a non-empty list of valid ids, returned sorted and unique.
pub(crate) fn allowed_token_ids(f: Field<'_>, limits: &Limits) -> CoreResult<Option<Vec<TokenId>>> {
    Ok(token_ids(f, limits, true)?.map(|mut ids| {
        ids.sort_unstable();
        ids.dedup();
        ids
    }))
}

/// `logit_bias`: an object from token id (a decimal string, as JSON keys are) to a bias in
/// [-100, 100]; returned sorted by id. Two keys naming the same id ("7" and "07") conflict.
pub(crate) fn logit_bias(f: Field<'_>, limits: &Limits) -> CoreResult<Vec<(TokenId, f32)>> {
    let Some(obj) = f.obj()? else {
        return Ok(Vec::new());
    };
    let top = max_token_id(limits);
    let mut out = Vec::with_capacity(obj.entries.len());
    for (key, value) in obj.members() {
        let id = match key.trim().parse::<i128>() {
            Ok(id) if (0..=top).contains(&id) => id as TokenId,
            Ok(_) => {
                return Err(value.bad(
                    codes::OUT_OF_RANGE,
                    format_args!("must be keyed by a token id in [0, {top}]"),
                ))
            }
            Err(_) => {
                return Err(value.bad(
                    codes::INVALID_FORMAT,
                    "must be keyed by a token id written as a decimal integer",
                ))
            }
        };
        let Some(bias) = float_in(value, BIAS, "")? else {
            return Err(value.wrong_type("a number"));
        };
        out.push((id, bias));
    }
    out.sort_unstable_by_key(|&(id, _)| id);
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(f.bad(
            codes::CONFLICT,
            format_args!("must name each token id once; {} appears twice", w[0].0),
        ));
    }
    Ok(out)
}

/// `embedding_bias`: one finite float per vocabulary entry (length checked when the
/// vocabulary is known; a `[1, vocab]` nesting is accepted).
pub(crate) fn embedding_bias(f: Field<'_>, limits: &Limits) -> CoreResult<Option<Arc<[f32]>>> {
    let Some(mut items) = f.list()? else {
        return Ok(None);
    };
    if let [Raw::List(row)] = items {
        items = row;
    }
    let vocab = limits.vocab_size as usize;
    if items.is_empty() || (vocab > 0 && items.len() != vocab) {
        let want = if vocab > 0 {
            format!(
                "must have vocab_size = {vocab} values (it has {})",
                items.len()
            )
        } else {
            "must not be empty".to_string()
        };
        return Err(f.bad(codes::INVALID_FORMAT, want));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let item = Field::new(f.path.index(i), Some(item));
        match item.float()? {
            Some(x) => out.push(x as f32),
            None => return Err(item.wrong_type("a number")),
        }
    }
    Ok(Some(out.into()))
}

/// The vLLM extras the `/v1` routes accept with vLLM ranges: `min_p` in [0, 1], `min_tokens`
/// >= 0, `logit_bias`, `allowed_token_ids`, `spaces_between_special_tokens`.
pub(crate) fn vllm_extras(o: &Obj<'_>, p: &mut SamplingParams, limits: &Limits) -> CoreResult<()> {
    p.min_p = float_in(o.field("min_p"), UNIT, "")?.unwrap_or(0.0);
    p.min_tokens = u32_in(o.field("min_tokens"), 0, u32::MAX)?.unwrap_or(0);
    p.logit_bias = logit_bias(o.field("logit_bias"), limits)?;
    p.allowed_token_ids = allowed_token_ids(o.field("allowed_token_ids"), limits)?;
    p.spaces_between_special_tokens = o
        .field("spaces_between_special_tokens")
        .bool()?
        .unwrap_or(true);
    Ok(())
}

/// `min_tokens` must not exceed an explicit `max_tokens` (the error names `min_tokens`).
pub(crate) fn min_tokens_at_most(
    o: &Obj<'_>,
    min_tokens: u32,
    max_tokens: Option<u64>,
) -> CoreResult<()> {
    match max_tokens {
        Some(max) if u64::from(min_tokens) > max => Err(o.field("min_tokens").bad(
            codes::OUT_OF_RANGE,
            format_args!("must be <= `max_tokens` ({max})"),
        )),
        _ => Ok(()),
    }
}
