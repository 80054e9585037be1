//! What this build can serve: the one table of features a request may ask for that are not
//! built yet. A request asking for one is refused with an `unsupported` error naming the field,
//! never quietly served as something else. Each later feature flips its row here.

use crate::error::{CoreError, CoreResult};
use crate::params::SamplingParams;

use super::codes;
use super::request::{Switches, ValidRequest};
use super::Route;

/// One feature and whether it is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// `use_beam_search` / TRT `beam_width` > 1.
    pub beam_search: bool,
    /// `best_of` > `n`: several candidates ranked by cumulative logprob.
    pub best_of: bool,
    /// `tools` the model may call (parsing tool calls out of the output). Built: whether a
    /// server parses them is its `--tool-call-parser`, which the server checks.
    pub tool_calls: bool,
    /// `response_format` JSON modes (constrained decoding).
    pub structured_output: bool,
    /// `/v1/completions` `suffix`: text inserted after the completion.
    pub suffix_insertion: bool,
    /// The Databricks embeddings task. Built: whether a server serves it is its task
    /// (`--task embed`), which the server checks before validating.
    pub embeddings: bool,
}

/// What this build serves today.
pub const BUILT: Capabilities = Capabilities {
    beam_search: true,
    best_of: true,
    tool_calls: true,
    structured_output: true,
    suffix_insertion: false,
    embeddings: true,
};

fn unsupported(param: &str, what: impl std::fmt::Display) -> CoreError {
    CoreError::invalid(param, codes::UNSUPPORTED, format!("`{param}`: {what}"))
}

/// Refuses parameters that ask for an unbuilt feature (every caller of the engine, offline
/// ones too).
pub fn check_params(p: &SamplingParams, caps: &Capabilities) -> CoreResult<()> {
    if p.use_beam_search && !caps.beam_search {
        return Err(unsupported(
            "use_beam_search",
            "beam search is not supported yet",
        ));
    }
    if p.use_beam_search && !p.stop.is_empty() {
        return Err(CoreError::invalid(
            "stop",
            codes::CONFLICT,
            "`stop` strings cannot be used with `use_beam_search` (beam hypotheses end on tokens)",
        ));
    }
    // Under beam search `best_of` is the beam width, not a number of samples to rank.
    if !p.use_beam_search && p.best_of != p.n && !caps.best_of {
        return Err(unsupported(
            "best_of",
            format_args!(
                "choosing the best of several samples is not supported yet ({} other than `n` = {}); send `best_of` equal to `n` or leave it out",
                p.best_of, p.n
            ),
        ));
    }
    Ok(())
}

/// Refuses a validated request that asks for an unbuilt feature: its parameters, then the
/// route switches.
pub fn check_request(req: &ValidRequest, caps: &Capabilities) -> CoreResult<()> {
    if req.route == Route::DatabricksEmbeddings && !caps.embeddings {
        return Err(unsupported(
            "input",
            "this endpoint does not support the embeddings task: no embedding model is loaded",
        ));
    }
    check_params(&req.params, caps)?;
    check_switches(req.route, &req.switches, caps)
}

fn check_switches(route: Route, s: &Switches, caps: &Capabilities) -> CoreResult<()> {
    let calls_tools = s.has_tools && (s.forces_tool || s.tool_choice.as_deref() != Some("none"));
    if calls_tools && !caps.tool_calls {
        return Err(unsupported(
            "tools",
            "this model does not support tool calling (no tool-call parser is built yet); send `tool_choice: \"none\"` or leave `tools` out",
        ));
    }
    if let Some(kind) = s.response_format.as_deref().filter(|k| *k != "text") {
        if !caps.structured_output {
            return Err(unsupported(
                "response_format",
                format_args!("`{kind}` is not supported yet (constrained decoding is not built); only `{{\"type\": \"text\"}}` is accepted"),
            ));
        }
    }
    // Databricks appends its `suffix` (docs/decisions.md#the-suffix), which is built; `/v1` inserts
    // it.
    let inserts = route == Route::Completions && s.suffix.as_deref().is_some_and(|x| !x.is_empty());
    if inserts && !caps.suffix_insertion {
        return Err(unsupported(
            "suffix",
            "insertion (`suffix`) is not supported",
        ));
    }
    Ok(())
}
