//! MindIE `/v1/chat/completions` (docs/api/openai.md#chat-completions) and `/v1/completions`
//! (docs/api/openai.md#completions-request, docs/api/openai.md#n-best-of-and-beam-search), each
//! with its own ranges, plus the vLLM extras (see the module docs of `validate`).

use crate::error::CoreResult;
use crate::params::SamplingParams;

use super::beam::beam_options;
use super::request::{routed, ValidRequest};
use super::Route;

use super::codes;
use super::common::{
    float_in, int_in, make_greedy, prompt_chars, prompts, seed, settle_include_stop_str,
    timeout_extra, top_k_minus_one_or_positive, u32_in, FloatRange, I32_MAX, NON_NEGATIVE, PENALTY,
    REPETITION_V1, UNIT_OPEN,
};
use super::limits::Limits;
use super::messages::messages;
use super::raw::{fail, Obj, Raw};
use super::stops::{stop, stop_token_ids_lenient};
use super::tokens::{min_tokens_at_most, vllm_extras};
use super::tools::{response_format, tool_choice, tools};
use super::Flavor;

/// Completions' `top_p` range, `(1e-6, 1]` (docs/decisions.md#top-p-ranges).
const TOP_P_COMPLETIONS: FloatRange = FloatRange::new(1e-6, true, 1.0, false);
/// Largest completions `logprobs`.
pub(super) const MAX_COMPLETIONS_LOGPROBS: u32 = 5;

/// What differs between the two `/v1` routes in the fields they share.
struct V1Rules {
    /// Smallest seed: 0 on chat, 1 on completions (docs/decisions.md#seed-ranges).
    min_seed: u64,
    top_p: FloatRange,
    /// Smallest `max_tokens`: 1, or 0 on completions, where 0 with `echo` scores the prompt
    /// without generating (what lm-evaluation-harness sends; checked by the route).
    min_max_tokens: i128,
}

/// The fields chat and completions share. Returns the parameters, the explicit `max_tokens`
/// and the explicit temperature (cross-field rules need to know it was given).
fn v1_sampling(
    o: &Obj<'_>,
    rules: &V1Rules,
    limits: &Limits,
) -> CoreResult<(SamplingParams, Option<u64>, Option<f32>)> {
    let temperature = float_in(o.field("temperature"), NON_NEGATIVE, "")?;
    let mut p = SamplingParams {
        presence_penalty: float_in(o.field("presence_penalty"), PENALTY, "")?.unwrap_or(0.0),
        frequency_penalty: float_in(o.field("frequency_penalty"), PENALTY, "")?.unwrap_or(0.0),
        repetition_penalty: float_in(o.field("repetition_penalty"), REPETITION_V1, "")?
            .unwrap_or(1.0),
        temperature: temperature.unwrap_or(1.0),
        top_p: float_in(o.field("top_p"), rules.top_p, "")?.unwrap_or(1.0),
        top_k: top_k_minus_one_or_positive(o.field("top_k"), I32_MAX, limits)?,
        seed: seed(o.field("seed"), rules.min_seed)?,
        stop: stop(o.field("stop"), limits)?,
        stop_token_ids: stop_token_ids_lenient(o.field("stop_token_ids"), limits)?,
        include_stop_str_in_output: o
            .field("include_stop_str_in_output")
            .bool()?
            .unwrap_or(false),
        skip_special_tokens: o.field("skip_special_tokens").bool()?.unwrap_or(true),
        ignore_eos: o.field("ignore_eos").bool()?.unwrap_or(false),
        ..SamplingParams::default()
    };
    vllm_extras(o, &mut p, limits)?;
    p.prompt_logprobs = prompt_logprobs(o, limits)?;
    p.timeout_s = timeout_extra(o.field("timeout"))?;
    let max_tokens = int_in(o.field("max_tokens"), rules.min_max_tokens, I32_MAX)?;
    let max_tokens = max_tokens.map(|m| m as u64);
    min_tokens_at_most(o, p.min_tokens, max_tokens)?;
    o.field("stream").bool()?;
    let model = o.field("model");
    model.str()?.ok_or_else(|| model.missing())?;
    settle_include_stop_str(&mut p);
    Ok((p, max_tokens, temperature))
}

/// vLLM's `prompt_logprobs` extra: how many alternatives (0..=max_logprobs) to report with
/// each prompt token's logprob. Not with streaming (vLLM's rule too: a response field, not
/// a stream delta).
fn prompt_logprobs(o: &Obj<'_>, limits: &Limits) -> CoreResult<Option<u32>> {
    let f = o.field("prompt_logprobs");
    let k = u32_in(f, 0, limits.max_logprobs)?;
    if k.is_some() && o.field("stream").bool()? == Some(true) {
        return Err(f.bad(codes::CONFLICT, "cannot be used with `stream: true`"));
    }
    Ok(k)
}

/// `n` > 1 (or `best_of` > 1) samples several sequences, which greedy decoding cannot
/// (docs/api/openai.md#n-best-of-and-beam-search,
/// docs/decisions.md#temperature-and-several-sequences): an explicit temperature 0 then conflicts.
fn needs_sampling(o: &Obj<'_>, several: bool, temperature: Option<f32>) -> CoreResult<()> {
    if several && temperature == Some(0.0) {
        return Err(fail(
            o.field("temperature").path,
            codes::CONFLICT,
            "must be > 0 when `n` or `best_of` is > 1; got 0",
        ));
    }
    Ok(())
}

/// Validates a `/v1/chat/completions` body.
pub(super) fn chat(body: &Raw, limits: &Limits) -> CoreResult<ValidRequest> {
    let o = Obj::root(body)?;
    let chars = messages(o.field("messages"), Flavor::MindIE, limits.multimodal)?;
    prompt_chars(o.field("messages"), chars, limits)?;
    let names = tools(o.field("tools"), Flavor::MindIE, None)?;
    tool_choice(o.field("tool_choice"), &names)?;
    response_format(o.field("response_format"))?;
    // vLLM's extra: keyword arguments for the chat template (`enable_thinking`), an object.
    o.field("chat_template_kwargs").obj()?;
    let rules = V1Rules {
        min_seed: 0,
        top_p: UNIT_OPEN,
        min_max_tokens: 1,
    };
    let (mut p, max_tokens, temperature) = v1_sampling(&o, &rules, limits)?;
    p.n = u32_in(o.field("n"), 1, limits.max_n)?.unwrap_or(1);
    p.best_of = p.n;
    needs_sampling(&o, p.n > 1, temperature)?;
    p.logprobs = chat_logprobs(&o, limits)?;
    if p.temperature == 0.0 {
        make_greedy(&mut p);
    }
    let requested = max_tokens.unwrap_or(limits.max_iter_times.into());
    routed(Route::Chat, body, p, Some(requested), "messages", limits)
}

/// Chat `logprobs` (bool) and `top_logprobs` (0..=max_logprobs, only with `logprobs: true`):
/// `Some(top_logprobs or 0)` when logprobs are on. Shared with Databricks chat.
pub(super) fn chat_logprobs(o: &Obj<'_>, limits: &Limits) -> CoreResult<Option<u32>> {
    let logprobs = o.field("logprobs").bool()?.unwrap_or(false);
    let top_field = o.field("top_logprobs");
    let top = u32_in(top_field, 0, limits.max_logprobs)?;
    if top.is_some() && !logprobs {
        return Err(top_field.bad(codes::CONFLICT, "needs `logprobs: true`"));
    }
    Ok(logprobs.then(|| top.unwrap_or(0)))
}

/// Validates a `/v1/completions` body.
pub(super) fn completions(body: &Raw, limits: &Limits) -> CoreResult<ValidRequest> {
    let o = Obj::root(body)?;
    prompts(o.field("prompt"), limits, true)?;
    // vLLM takes `response_format` on completions too: its shape is checked as on chat.
    response_format(o.field("response_format"))?;
    let rules = V1Rules {
        min_seed: 1,
        top_p: TOP_P_COMPLETIONS,
        min_max_tokens: 0,
    };
    let (mut p, mut max_tokens, temperature) = v1_sampling(&o, &rules, limits)?;
    p.logprobs = u32_in(o.field("logprobs"), 0, MAX_COMPLETIONS_LOGPROBS)?;
    let echo = o.field("echo").bool()?.unwrap_or(false);
    echo_prompt_logprobs(&mut p, echo);
    if max_tokens == Some(0) {
        if !echo {
            return Err(o.field("max_tokens").bad(
                codes::OUT_OF_RANGE,
                "must be an integer in [1, 2147483647]; 0 is accepted only with `echo: true`, to score the prompt without generating",
            ));
        }
        // One token is generated and left out of the response (`Switches::score_only`).
        max_tokens = Some(1);
    }
    sequences(&o, &mut p, temperature, limits)?;
    if p.temperature == 0.0 {
        make_greedy(&mut p);
    }
    let requested = max_tokens.unwrap_or(limits.max_iter_times.into());
    routed(
        Route::Completions,
        body,
        p,
        Some(requested),
        "prompt",
        limits,
    )
}

/// `echo` with `logprobs: k` returns the prompt tokens' logprobs before the generated ones,
/// so the prompt is scored with (at least) k alternatives (shared with Databricks).
pub(super) fn echo_prompt_logprobs(p: &mut SamplingParams, echo: bool) {
    if let (true, Some(k)) = (echo, p.logprobs) {
        p.prompt_logprobs = Some(p.prompt_logprobs.map_or(k, |q| q.max(k)));
    }
}

/// `n`, `best_of` and `use_beam_search` with the cross-field rules
/// (docs/api/openai.md#n-best-of-and-beam-search).
fn sequences(
    o: &Obj<'_>,
    p: &mut SamplingParams,
    temperature: Option<f32>,
    limits: &Limits,
) -> CoreResult<()> {
    let beam = o.field("use_beam_search").bool()?.unwrap_or(false);
    let stream = o.field("stream").bool()?.unwrap_or(false);
    let n = u32_in(o.field("n"), 1, limits.max_n)?;
    let best_of_field = o.field("best_of");
    let best_of = u32_in(best_of_field, 1, limits.max_n)?;
    p.n = n.unwrap_or(1);
    if beam {
        if !p.stop.is_empty() {
            return Err(o
                .field("stop")
                .bad(codes::CONFLICT, "cannot be used with `use_beam_search`"));
        }
        // Beam width = best_of if given, else n (docs/decisions.md#beam-width); best_of is not
        // checked against n (docs/api/openai.md#n-best-of-and-beam-search), so the width grows to n
        // when it is smaller, to return n beams.
        p.best_of = best_of.unwrap_or(p.n).max(p.n);
        p.use_beam_search = true;
        check_beam_width(o, p.best_of, limits)?;
        return beam_options(o, p);
    }
    beam_options(o, p)?;
    p.best_of = best_of.unwrap_or(p.n);
    if let Some(b) = best_of {
        let ok = if stream {
            // Streaming sends each sequence as it grows, so there is no choosing: best_of
            // must equal n; a lone best_of: 1 equals the default n and passes
            // (docs/api/openai.md#n-best-of-and-beam-search).
            b == p.n && (n.is_some() || b == 1)
        } else {
            b >= p.n
        };
        if !ok {
            let rule = if stream {
                format!(
                    "must equal `n` ({}) when streaming, and be given only with `n`",
                    p.n
                )
            } else {
                format!("must be >= `n` ({})", p.n)
            };
            return Err(best_of_field.bad(codes::CONFLICT, rule));
        }
    }
    needs_sampling(o, p.n > 1 || p.best_of > 1, temperature)
}

/// The beam width must not exceed `max_beam_width` (the error names `best_of`, or `n` when
/// the width came from it).
pub(super) fn check_beam_width(o: &Obj<'_>, width: u32, limits: &Limits) -> CoreResult<()> {
    if width > limits.max_beam_width {
        let key = if o.has("best_of") { "best_of" } else { "n" };
        return Err(o.field(key).bad(
            codes::OUT_OF_RANGE,
            format_args!(
                "must give a beam width of at most {} with `use_beam_search`",
                limits.max_beam_width
            ),
        ));
    }
    Ok(())
}
