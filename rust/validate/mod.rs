//! Request validation: one function per API route that checks a decoded request body against
//! that route's own rules (docs/api/common.md#ranges-by-route: each route keeps its source's
//! ranges) and builds the normalised [`SamplingParams`] every later stage shares.
//!
//! Common rules (docs/api/common.md#request-bodies): JSON null is the same as absent (defaults
//! apply) except for required fields; unknown fields are ignored; types are strict (integer fields
//! reject strings, bools and fractions, float fields accept integers, bool fields take only bools).
//! Every error is [`CoreError::Invalid`] whose `param` is the field path as the client wrote
//! it (`parameters.temperature`, `messages[2].content[1].type`, `stop[3]`), whose `code` is
//! one of [`codes`], and whose message names the field in backticks, states the rule and
//! quotes the value.
//!
//! The `/v1` routes also accept vLLM's extras with vLLM ranges: `min_p` in [0, 1],
//! `min_tokens` >= 0 (and <= `max_tokens`), `logit_bias` (token id -> [-100, 100]),
//! `allowed_token_ids` and `spaces_between_special_tokens`.
//!
//! Route-level switches that are not sampling parameters (`stream`, `details`, `echo`,
//! `suffix`, `tools`, `response_format`, ...) are checked here too and come back with the
//! parameters in one [`ValidRequest`]; what this build cannot serve yet is refused from one
//! table, [`capabilities`](Capabilities).

mod admit;
mod beam;
mod capabilities;
mod common;
mod databricks;
mod embeddings;
mod json;
mod limits;
mod messages;
mod mindie;
mod offline;
mod openai;
mod raw;
mod request;
mod stops;
mod structured;
mod template;
mod tokens;
mod tools;
mod trt;

#[cfg(test)]
mod tests;

pub use admit::{admit, EngineAsks, EngineLimits};
pub use capabilities::{check_params as check_capabilities, check_request, Capabilities, BUILT};
pub use embeddings::{check_input_tokens, MAX_EMBED_INPUTS, MAX_EMBED_TOTAL_TOKENS};
pub use json::{parse_body, parse_value, path_string, too_deep, Seg, MAX_DEPTH};
pub use limits::{
    check_prompt_tokens, max_prompt_tokens, EndpointType, Limits, MAX_PROMPT_TOKENS_CAP,
};
pub use offline::OFFLINE_FIELDS;
pub use raw::Raw;
pub use request::{Switches, ValidRequest};
pub use template::{joined_text, template_messages};

use crate::error::{CoreError, CoreResult};
use crate::params::SamplingParams;

/// The stable `code` tags of validation errors.
pub mod codes {
    /// A number outside the field's range (or a cross-field bound such as
    /// `min_tokens <= max_tokens`).
    pub const OUT_OF_RANGE: &str = "out_of_range";
    /// A value of the wrong JSON type.
    pub const WRONG_TYPE: &str = "wrong_type";
    /// A required field is absent or null.
    pub const MISSING: &str = "missing";
    /// A text or list over its length limit (prompt characters or tokens, stop strings).
    pub const TOO_LONG: &str = "too_long";
    /// A string or list that must not be empty is.
    pub const EMPTY: &str = "empty";
    /// Two fields that cannot be used together, or a field the other fields rule out.
    pub const CONFLICT: &str = "conflict";
    /// A media content part the model or route does not take (docs/api/common.md#content-parts).
    pub const UNSUPPORTED_CONTENT_TYPE: &str = "unsupported_content_type";
    /// A string that breaks a format (the generate `id` pattern, a word-list tensor, ...).
    pub const INVALID_FORMAT: &str = "invalid_format";
    /// A value outside a fixed set (a role, a part type, a `tool_choice` string, ...).
    pub const INVALID_VALUE: &str = "invalid_value";
    /// More items than allowed (tools, media parts, properties).
    pub const TOO_MANY: &str = "too_many";
    /// A parameter this deployment does not offer (Databricks endpoint type,
    /// docs/decisions.md#endpoint-types).
    pub const UNSUPPORTED: &str = "unsupported";
    /// A field the route does not take (`/v1/embeddings` refuses unknown fields).
    pub const UNKNOWN_FIELD: &str = "unknown_field";
}

/// An API route whose request body `validate` understands.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// MindIE `generate` and `generate_stream` (the same body, docs/api/mindie.md#request,
    /// docs/api/mindie.md#generate-response).
    Generate,
    /// MindIE `/v1/chat/completions` (docs/api/openai.md#chat-completions).
    Chat,
    /// MindIE `/v1/completions` (docs/api/openai.md#completions).
    Completions,
    /// Databricks chat task (docs/api/databricks.md#chat-request).
    DatabricksChat,
    /// Databricks completions task (docs/api/databricks.md#completions-request).
    DatabricksCompletions,
    /// Databricks embeddings task (docs/api/databricks.md#embeddings-task).
    DatabricksEmbeddings,
    /// OpenAI `/v1/embeddings`.
    Embeddings,
    /// The TensorRT-LLM-style in-process request (docs/api/trt.md), tensors as Python values.
    Trt,
    /// The Python `SamplingParams(...)` constructor: vLLM-style keyword arguments.
    Offline,
}

const ROUTE_NAMES: [(&str, Route); 10] = [
    ("generate", Route::Generate),
    ("generate_stream", Route::Generate),
    ("chat", Route::Chat),
    ("completions", Route::Completions),
    ("databricks_chat", Route::DatabricksChat),
    ("databricks_completions", Route::DatabricksCompletions),
    ("databricks_embeddings", Route::DatabricksEmbeddings),
    ("embeddings", Route::Embeddings),
    ("trt", Route::Trt),
    ("offline", Route::Offline),
];

impl Route {
    /// The route's name (`parse` reads it back; MindIE's two routes are "generate").
    pub fn name(self) -> &'static str {
        ROUTE_NAMES
            .iter()
            .find(|(_, route)| *route == self)
            .map_or("", |(name, _)| name)
    }

    /// Parses a route name: "generate", "generate_stream", "chat", "completions",
    /// "databricks_chat", "databricks_completions", "databricks_embeddings", "embeddings",
    /// "trt", "offline".
    pub fn parse(name: &str) -> CoreResult<Route> {
        ROUTE_NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, route)| route)
            .ok_or_else(|| {
                let names: Vec<&str> = ROUTE_NAMES.iter().map(|(n, _)| *n).collect();
                CoreError::invalid(
                    "route",
                    codes::INVALID_VALUE,
                    format!("`route` must be one of {}; got {name:?}", names.join(", ")),
                )
            })
    }
}

/// Which source's rules a shared check follows where MindIE and Databricks differ.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Flavor {
    MindIE,
    Databricks,
}

/// Validates the whole decoded request body of `route` once: its parameters and its route
/// switches. The rules that need the prompt's token count come after tokenizing, from
/// [`ValidRequest::fit_prompt`] or [`ValidRequest::with_prompt_tokens`]. `limits` must have
/// passed [`Limits::validate`].
pub fn validate_request(route: Route, body: &Raw, limits: &Limits) -> CoreResult<ValidRequest> {
    let valid = route_rules(route, body, limits)?;
    // The one place a feature this build does not serve is refused, for every caller: the
    // HTTP routes, the TRT request and the offline `SamplingParams` all come through here.
    check_request(&valid, &BUILT)?;
    Ok(valid)
}

/// The Databricks task a body asks for by its shape (docs/decisions.md#choosing-the-task): exactly
/// one of `messages` (chat), `prompt` (completions) or `input` (embeddings), present and not null.
pub fn databricks_route(body: &Raw) -> CoreResult<Route> {
    let tasks = [
        ("messages", Route::DatabricksChat),
        ("prompt", Route::DatabricksCompletions),
        ("input", Route::DatabricksEmbeddings),
    ];
    let found: Vec<_> = tasks
        .iter()
        .filter(|(key, _)| !matches!(body.get(key), None | Some(Raw::Null)))
        .collect();
    match found.as_slice() {
        [(_, route)] => Ok(*route),
        _ => {
            let names: Vec<String> = found.iter().map(|(k, _)| format!("`{k}`")).collect();
            let names = if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            };
            Err(CoreError::invalid(
                json::WHOLE_BODY,
                codes::INVALID_VALUE,
                format!("the body must have exactly one of `messages` (chat), `prompt` (completions) or `input` (embeddings); found {names}"),
            ))
        }
    }
}

fn route_rules(route: Route, body: &Raw, limits: &Limits) -> CoreResult<ValidRequest> {
    match route {
        Route::Generate => mindie::generate(body, limits),
        Route::Chat => openai::chat(body, limits),
        Route::Completions => openai::completions(body, limits),
        Route::DatabricksChat => databricks::chat(body, limits),
        Route::DatabricksCompletions => databricks::completions(body, limits),
        Route::DatabricksEmbeddings => embeddings::databricks(body, limits),
        Route::Embeddings => embeddings::openai(body, limits),
        Route::Trt => trt::trt(body, limits),
        Route::Offline => offline::offline(body, limits),
    }
}

/// Validates the whole decoded request body of `route` and returns the normalised parameters.
///
/// With `num_prompt_tokens` (the prompt's token count, after the chat template for chat), it
/// also applies the token limit (docs/api/common.md#prompt-limits) and the output cap
/// (docs/api/common.md#output-cap)
/// `max_tokens = min(requested or the route default, max_iter_times, max_model_len -
/// prompt_tokens)`; without it, `max_tokens` is capped by `max_iter_times` only. (The TRT route
/// counts its own `input_ids`; the offline route applies no cap without a count, since it has no
/// model to cap against.) `limits` must have passed [`Limits::validate`].
pub fn validate(
    route: Route,
    body: &Raw,
    num_prompt_tokens: Option<u32>,
    limits: &Limits,
) -> CoreResult<SamplingParams> {
    validate_request(route, body, limits)?.with_prompt_tokens(num_prompt_tokens, None, limits)
}
