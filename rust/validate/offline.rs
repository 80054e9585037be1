//! The offline route: the Python `SamplingParams(...)` constructor. Keyword arguments are the
//! `SamplingParams` field names, with vLLM's ranges; token ids are checked strictly (a bad id
//! is an error, not dropped as on the HTTP routes).

use crate::error::CoreResult;
use crate::params::SamplingParams;

use super::beam::beam_options;
use super::request::{read_switches, OutputCap, ValidRequest};
use super::Route;

use super::codes;
use super::common::{
    float_in, int_in, make_greedy, normalise_top_k, seed, settle_include_stop_str, u32_in,
    NON_NEGATIVE, PENALTY, POSITIVE, UNIT, UNIT_OPEN,
};
use super::limits::Limits;
use super::openai::check_beam_width;
use super::raw::{fail, Obj, Raw};
use super::stops::stop;
use super::tokens::{
    allowed_token_ids, embedding_bias, logit_bias, min_tokens_at_most, token_id_lists, token_ids,
};

/// Every keyword the offline route reads: the `SamplingParams` field names.
pub const OFFLINE_FIELDS: [&str; 32] = [
    "n",
    "best_of",
    "use_beam_search",
    "length_penalty",
    "early_stopping",
    "max_tokens",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
    "priority",
    "timeout_s",
    "stop",
    "stop_token_sequences",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "logit_bias",
    "embedding_bias",
    "allowed_token_ids",
    "bad_words",
    "no_repeat_ngram_size",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "seed",
    "logprobs",
    "prompt_logprobs",
];

/// Validates offline keyword arguments. Without a prompt token count `max_tokens` stays as
/// given (None = until `max_model_len`); with one, the cap (docs/api/common.md#output-cap) applies.
pub(super) fn offline(body: &Raw, limits: &Limits) -> CoreResult<ValidRequest> {
    let o = Obj::root(body)?;
    let mut p = sampling(&o, limits)?;
    tokens_and_text(&o, &mut p, limits)?;
    let max_tokens = u32_in(o.field("max_tokens"), 1, u32::MAX)?;
    p.min_tokens = u32_in(o.field("min_tokens"), 0, u32::MAX)?.unwrap_or(0);
    min_tokens_at_most(&o, p.min_tokens, max_tokens.map(u64::from))?;
    p.max_tokens = max_tokens;
    p.priority = int_in(o.field("priority"), 1, 5)?.map_or(5, |v| v as u8);
    let timeout = o.field("timeout_s");
    p.timeout_s = match timeout.float()? {
        Some(t) if t <= 0.0 => return Err(timeout.bad(codes::OUT_OF_RANGE, "must be > 0")),
        t => t,
    };
    p.logprobs = u32_in(o.field("logprobs"), 0, limits.max_logprobs)?;
    p.prompt_logprobs = u32_in(o.field("prompt_logprobs"), 0, limits.max_logprobs)?;
    p.no_repeat_ngram_size = u32_in(o.field("no_repeat_ngram_size"), 0, u32::MAX)?.unwrap_or(0);
    sequences(&o, &mut p, limits)?;
    if p.temperature == 0.0 {
        make_greedy(&mut p);
    }
    let cap = OutputCap::WithCountOnly {
        requested: max_tokens.map(u64::from),
    };
    let switches = read_switches(Route::Offline, body)?;
    ValidRequest::new(Route::Offline, p, switches, cap, limits)
}

/// The numeric sampling fields.
fn sampling(o: &Obj<'_>, limits: &Limits) -> CoreResult<SamplingParams> {
    let top_k = int_in(o.field("top_k"), -1, i128::MAX)?;
    Ok(SamplingParams {
        temperature: float_in(o.field("temperature"), NON_NEGATIVE, "")?.unwrap_or(1.0),
        top_p: float_in(o.field("top_p"), UNIT_OPEN, "")?.unwrap_or(1.0),
        top_k: top_k.map_or(0, |k| normalise_top_k(k, limits.vocab_size)),
        min_p: float_in(o.field("min_p"), UNIT, "")?.unwrap_or(0.0),
        typical_p: float_in(o.field("typical_p"), UNIT_OPEN, "")?.unwrap_or(1.0),
        repetition_penalty: float_in(o.field("repetition_penalty"), POSITIVE, "")?.unwrap_or(1.0),
        presence_penalty: float_in(o.field("presence_penalty"), PENALTY, "")?.unwrap_or(0.0),
        frequency_penalty: float_in(o.field("frequency_penalty"), PENALTY, "")?.unwrap_or(0.0),
        seed: seed(o.field("seed"), 0)?,
        ..SamplingParams::default()
    })
}

/// Stops, token-id fields and the text switches.
fn tokens_and_text(o: &Obj<'_>, p: &mut SamplingParams, limits: &Limits) -> CoreResult<()> {
    p.stop = stop(o.field("stop"), limits)?;
    p.stop_token_ids = token_ids(o.field("stop_token_ids"), limits, false)?.unwrap_or_default();
    p.stop_token_sequences = token_id_lists(o.field("stop_token_sequences"), limits)?;
    p.bad_words = token_id_lists(o.field("bad_words"), limits)?;
    p.logit_bias = logit_bias(o.field("logit_bias"), limits)?;
    p.allowed_token_ids = allowed_token_ids(o.field("allowed_token_ids"), limits)?;
    p.embedding_bias = embedding_bias(o.field("embedding_bias"), limits)?;
    let flag = |key: &str, default: bool| -> CoreResult<bool> {
        Ok(o.field(key).bool()?.unwrap_or(default))
    };
    p.ignore_eos = flag("ignore_eos", false)?;
    p.include_stop_str_in_output = flag("include_stop_str_in_output", false)?;
    p.skip_special_tokens = flag("skip_special_tokens", true)?;
    p.spaces_between_special_tokens = flag("spaces_between_special_tokens", true)?;
    settle_include_stop_str(p);
    Ok(())
}

/// `n`, `best_of` (default n, at least n) and `use_beam_search` (beam width = best_of, no stop
/// strings); several sampled sequences need temperature > 0.
fn sequences(o: &Obj<'_>, p: &mut SamplingParams, limits: &Limits) -> CoreResult<()> {
    p.n = u32_in(o.field("n"), 1, limits.max_n)?.unwrap_or(1);
    let best_of_field = o.field("best_of");
    p.best_of = u32_in(best_of_field, 1, limits.max_n)?.unwrap_or(p.n);
    if p.best_of < p.n {
        return Err(best_of_field.bad(codes::CONFLICT, format_args!("must be >= `n` ({})", p.n)));
    }
    p.use_beam_search = o.field("use_beam_search").bool()?.unwrap_or(false);
    if p.use_beam_search {
        if !p.stop.is_empty() {
            return Err(o
                .field("stop")
                .bad(codes::CONFLICT, "cannot be used with `use_beam_search`"));
        }
        check_beam_width(o, p.best_of, limits)?;
    }
    beam_options(o, p)?;
    if p.use_beam_search {
        return Ok(());
    }
    if p.best_of > 1 && p.temperature == 0.0 {
        return Err(fail(
            o.field("temperature").path,
            codes::CONFLICT,
            "must be > 0 when `n` or `best_of` is > 1; got 0",
        ));
    }
    Ok(())
}
