//! Databricks Foundation Model API tasks (docs/api/databricks.md: chat and completions; its
//! embeddings task is in `embeddings`), with the Databricks ranges and the endpoint-type rules
//! (docs/decisions.md#endpoint-types).

use crate::error::CoreResult;
use crate::params::SamplingParams;

use super::request::{routed, ValidRequest};
use super::Route;

use super::codes;
use super::common::{
    float_in, int_in, make_greedy, normalise_top_k, prompt_chars, prompts, timeout_extra, u32_in,
    FloatRange, UNIT,
};
use super::limits::{EndpointType, Limits};
use super::messages::messages;
use super::openai::{chat_logprobs, echo_prompt_logprobs, MAX_COMPLETIONS_LOGPROBS};
use super::raw::{Obj, Raw};
use super::stops::stop;
use super::tools::{response_format, tool_choice, tools};
use super::Flavor;

/// Databricks temperature range, `[0, 2]`.
const TEMPERATURE: FloatRange = FloatRange::new(0.0, false, 2.0, false);

/// Validates a Databricks chat body.
pub(super) fn chat(body: &Raw, limits: &Limits) -> CoreResult<ValidRequest> {
    let o = Obj::root(body)?;
    let chars = messages(o.field("messages"), Flavor::Databricks, limits.multimodal)?;
    prompt_chars(o.field("messages"), chars, limits)?;
    let max_tools = Some(limits.max_tools_databricks);
    let names = tools(o.field("tools"), Flavor::Databricks, max_tools)?;
    tool_choice(o.field("tool_choice"), &names)?;
    response_format(o.field("response_format"))?;
    let (mut p, max_tokens) = sampling(&o, limits)?;
    p.logprobs = chat_logprobs(&o, limits)?;
    routed(
        Route::DatabricksChat,
        body,
        p,
        max_tokens,
        "messages",
        limits,
    )
}

/// Validates a Databricks completions body. With `error_behavior: "truncate"` a prompt over
/// the token limit is not an error: the server cuts it from the left to
/// `max_prompt_tokens`, and the cap is computed for the cut prompt
/// (docs/decisions.md#what-truncate-does; see [`ValidRequest::fit_prompt`]).
pub(super) fn completions(body: &Raw, limits: &Limits) -> CoreResult<ValidRequest> {
    let o = Obj::root(body)?;
    prompts(o.field("prompt"), limits, false)?;
    let (mut p, max_tokens) = sampling(&o, limits)?;
    // Not in [DBX]: the OpenAI completions `logprobs` (an integer), so that `echo` can
    // return the prompt's logprobs as on `/v1/completions`.
    p.logprobs = u32_in(o.field("logprobs"), 0, MAX_COMPLETIONS_LOGPROBS)?;
    echo_prompt_logprobs(&mut p, o.field("echo").bool()?.unwrap_or(false));
    let behavior = o.field("error_behavior");
    let truncate = match behavior.str()? {
        None | Some("error") => false,
        Some("truncate") => true,
        Some(_) => {
            return Err(behavior.bad(codes::INVALID_VALUE, "must be \"error\" or \"truncate\""))
        }
    };
    if truncate && limits.databricks_endpoint_type == Some(EndpointType::ProvisionedThroughput) {
        return Err(behavior.bad(
            codes::UNSUPPORTED,
            "is accepted only on pay-per-token endpoints; this one is provisioned throughput",
        ));
    }
    o.field("suffix").str()?;
    o.field("echo").bool()?;
    o.field("use_raw_prompt").bool()?;
    routed(
        Route::DatabricksCompletions,
        body,
        p,
        max_tokens,
        "prompt",
        limits,
    )
}

/// The sampling fields chat and completions share. Temperature 0 or top_p 0 is greedy
/// (docs/decisions.md#greedy-with-several-completions), also with `n` > 1. Returns the explicit
/// `max_tokens` (null = no request cap).
fn sampling(o: &Obj<'_>, limits: &Limits) -> CoreResult<(SamplingParams, Option<u64>)> {
    let max_tokens = int_in(o.field("max_tokens"), 1, i128::MAX)?;
    let max_tokens = max_tokens.map(|m| u64::try_from(m).unwrap_or(u64::MAX));
    o.field("stream").bool()?;
    let top_k = int_in(o.field("top_k"), 1, i128::MAX)?;
    let mut p = SamplingParams {
        temperature: float_in(o.field("temperature"), TEMPERATURE, "")?.unwrap_or(1.0),
        top_p: float_in(o.field("top_p"), UNIT, "")?.unwrap_or(1.0),
        top_k: top_k.map_or(0, |k| normalise_top_k(k, limits.vocab_size)),
        stop: stop(o.field("stop"), limits)?,
        timeout_s: timeout_extra(o.field("timeout"))?,
        ..SamplingParams::default()
    };
    let n_field = o.field("n");
    p.n = u32_in(n_field, 1, limits.max_n)?.unwrap_or(1);
    p.best_of = p.n;
    if p.n > 1 && limits.databricks_endpoint_type == Some(EndpointType::PayPerToken) {
        return Err(n_field.bad(
            codes::UNSUPPORTED,
            "must be 1 on pay-per-token endpoints (n > 1 needs provisioned throughput)",
        ));
    }
    if p.temperature == 0.0 || p.top_p == 0.0 {
        make_greedy(&mut p);
    }
    Ok((p, max_tokens))
}
