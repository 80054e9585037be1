//! Embeddings bodies: OpenAI `/v1/embeddings` and the Databricks embeddings task
//! (docs/api/openai.md#embeddings, docs/api/databricks.md#embeddings-task).
//!
//! Nothing is generated, so the parameters are the defaults; what is checked is the input's
//! shape, the route's switches and the limits. `/v1/embeddings` takes `input` as a string, a
//! list of strings, a list of token ids (one input) or a list of token-id lists, plus
//! `encoding_format` (`float` or `base64`), `dimensions` (only the model's own: no model here
//! is trained for shortening), `user` and vLLM's `truncate_prompt_tokens` (-1: the model's
//! maximum), and refuses any other field. The Databricks task takes `input` (a string or a list
//! of strings) and an optional `instruction`. The token limits need the token counts:
//! [`check_input_tokens`] applies them after tokenizing (and truncating).

use crate::error::CoreResult;
use crate::params::SamplingParams;

use super::codes;
use super::common::prompt_chars;
use super::limits::Limits;
use super::raw::{fail, Field, Obj, Raw};
use super::request::{read_switches, OutputCap, ValidRequest};
use super::tokens::token_ids;
use super::Route;

/// Inputs per request, at most (OpenAI's documented limit).
pub const MAX_EMBED_INPUTS: usize = 2048;
/// Tokens per request, all inputs together, at most (OpenAI's documented limit).
pub const MAX_EMBED_TOTAL_TOKENS: u64 = 300_000;

/// The fields `/v1/embeddings` takes; any other is refused.
const OPENAI_FIELDS: [&str; 6] = [
    "dimensions",
    "encoding_format",
    "input",
    "model",
    "truncate_prompt_tokens",
    "user",
];

/// Validates an OpenAI `/v1/embeddings` body.
pub(super) fn openai(body: &Raw, limits: &Limits) -> CoreResult<ValidRequest> {
    let o = Obj::root(body)?;
    if let Raw::Map(entries) = body {
        if let Some((key, _)) = entries
            .iter()
            .find(|(k, _)| !OPENAI_FIELDS.contains(&k.as_str()))
        {
            return Err(fail(
                super::raw::Path::Root.key(key),
                codes::UNKNOWN_FIELD,
                format_args!(
                    "is an unknown field; /v1/embeddings takes {}",
                    OPENAI_FIELDS.join(", ")
                ),
            ));
        }
    }
    let model = o.field("model");
    if model.str()?.is_none() {
        return Err(model.missing());
    }
    openai_input(o.field("input"), limits)?;
    let format = o.field("encoding_format");
    let base64 = match format.str()? {
        None | Some("float") => false,
        Some("base64") => true,
        Some(_) => return Err(format.bad(codes::INVALID_VALUE, "must be \"float\" or \"base64\"")),
    };
    dimensions(o.field("dimensions"), limits)?;
    o.field("user").str()?;
    let truncate = truncate_prompt_tokens(o.field("truncate_prompt_tokens"), limits)?;
    let route = Route::Embeddings;
    let mut switches = read_switches(route, body)?;
    switches.base64 = base64;
    switches.truncate_prompt_tokens = truncate;
    let cap = OutputCap::LimitOnly {
        prompt_field: "input",
    };
    ValidRequest::new(route, SamplingParams::default(), switches, cap, limits)
}

/// Validates a Databricks embeddings body: `input` (a non-empty string or a non-empty list of
/// them) and an optional `instruction` (a string).
pub(super) fn databricks(body: &Raw, limits: &Limits) -> CoreResult<ValidRequest> {
    let o = Obj::root(body)?;
    let input = o.field("input");
    super::common::prompts(input, limits, false)?;
    count(input)?;
    o.field("instruction").str()?;
    let route = Route::DatabricksEmbeddings;
    let switches = read_switches(route, body)?;
    let cap = OutputCap::LimitOnly {
        prompt_field: "input",
    };
    ValidRequest::new(route, SamplingParams::default(), switches, cap, limits)
}

/// The OpenAI `input`: text (one string or a list of them) or token ids (one list or a list of
/// lists), never a mix; nothing empty; ids in the vocabulary; at most [`MAX_EMBED_INPUTS`].
fn openai_input(f: Field<'_>, limits: &Limits) -> CoreResult<()> {
    let want = "a non-empty string, a non-empty list of strings, a list of token ids or a list of token-id lists";
    match f.raw {
        None => Err(f.wrong_type(want)),
        Some(Raw::Str(s)) if s.is_empty() => Err(fail(f.path, codes::EMPTY, "must not be empty")),
        Some(Raw::Str(s)) => prompt_chars(f, s.chars().count(), limits),
        Some(Raw::List(items)) if items.is_empty() => {
            Err(f.bad(codes::EMPTY, "must not be an empty list"))
        }
        Some(Raw::List(items)) if matches!(items[0], Raw::Int(_)) => {
            token_ids(f, limits, true).map(|_| ())
        }
        Some(Raw::List(items)) => {
            count(f)?;
            let lists = matches!(items[0], Raw::List(_));
            for (i, item) in items.iter().enumerate() {
                let item = Field::new(f.path.index(i), Some(item));
                match (lists, item.raw) {
                    (true, Some(Raw::List(_))) => {
                        token_ids(item, limits, true)?;
                    }
                    (false, Some(Raw::Str(s))) if s.is_empty() => {
                        return Err(fail(item.path, codes::EMPTY, "must not be empty"));
                    }
                    (false, Some(Raw::Str(s))) => prompt_chars(item, s.chars().count(), limits)?,
                    (true, _) => {
                        return Err(item.wrong_type(
                            "a list of token ids like the other inputs (a list mixing text and token ids is not accepted)",
                        ))
                    }
                    (false, _) => {
                        return Err(item.wrong_type(
                            "a string like the other inputs (a list mixing text and token ids is not accepted)",
                        ))
                    }
                }
            }
            Ok(())
        }
        Some(_) => Err(f.wrong_type(want)),
    }
}

/// At most [`MAX_EMBED_INPUTS`] inputs in a list.
fn count(f: Field<'_>) -> CoreResult<()> {
    match f.raw {
        Some(Raw::List(items)) if items.len() > MAX_EMBED_INPUTS => Err(fail(
            f.path,
            codes::TOO_MANY,
            format_args!(
                "must have at most {MAX_EMBED_INPUTS} inputs per request; got {}",
                items.len()
            ),
        )),
        _ => Ok(()),
    }
}

/// `dimensions`: a positive integer, and only the model's own (`Limits::embedding_dimensions`,
/// when known).
fn dimensions(f: Field<'_>, limits: &Limits) -> CoreResult<()> {
    let Some(value) = f.int()? else {
        return Ok(());
    };
    if value < 1 {
        return Err(f.bad(codes::OUT_OF_RANGE, "must be a positive integer"));
    }
    let own = limits.embedding_dimensions;
    if own > 0 && value != i128::from(own) {
        return Err(f.bad(
            codes::UNSUPPORTED,
            format_args!(
                "is not supported: this model gives {own}-dimensional embeddings and was not trained for shortening (Matryoshka); leave `dimensions` out or send {own}"
            ),
        ));
    }
    Ok(())
}

/// vLLM's `truncate_prompt_tokens`: -1 (the model's maximum) or 1..=`max_input_tokens`;
/// returns the length inputs are cut to.
fn truncate_prompt_tokens(f: Field<'_>, limits: &Limits) -> CoreResult<Option<u32>> {
    let Some(value) = f.int()? else {
        return Ok(None);
    };
    let max = limits.max_input_tokens;
    match value {
        -1 => Ok(Some(max)),
        v if v < 1 => Err(f.bad(
            codes::OUT_OF_RANGE,
            "must be -1 (the model's maximum) or a positive integer",
        )),
        v if v > i128::from(max) => Err(f.bad(
            codes::OUT_OF_RANGE,
            format_args!("must be at most {max} (the model's input limit)"),
        )),
        v => Ok(Some(v as u32)),
    }
}

/// The token limits of an embeddings request, once its inputs are tokenized (and truncated):
/// each input at most `max_input_tokens` (an error names `input[i]`; on `/v1/embeddings` it
/// points at `truncate_prompt_tokens`), all together at most [`MAX_EMBED_TOTAL_TOKENS`].
/// Returns the total, the response's `usage.prompt_tokens`.
pub fn check_input_tokens(route: Route, lengths: &[usize], limits: &Limits) -> CoreResult<u64> {
    let max = limits.max_input_tokens as usize;
    let root = super::raw::Path::Root;
    let input = root.key("input");
    if let Some((i, &n)) = lengths.iter().enumerate().find(|(_, &n)| n > max) {
        let hint = match route {
            Route::Embeddings => "; send `truncate_prompt_tokens` to cut it",
            _ => "",
        };
        return Err(fail(
            input.index(i),
            codes::TOO_LONG,
            format_args!("has {n} tokens; the model takes at most {max}{hint}"),
        ));
    }
    let total: u64 = lengths.iter().map(|&n| n as u64).sum();
    if total > MAX_EMBED_TOTAL_TOKENS {
        return Err(fail(
            input,
            codes::TOO_LONG,
            format_args!("has {total} tokens in all; at most {MAX_EMBED_TOTAL_TOKENS} per request"),
        ));
    }
    Ok(total)
}
