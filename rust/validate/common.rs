//! Field checks shared by the routes: numeric ranges (each route passes its own,
//! docs/api/common.md#ranges-by-route), seeds, top-k normalisation, the output cap, and the
//! finishing touches every route applies to the parameters it built.

use std::fmt;

use crate::error::CoreResult;
use crate::params::SamplingParams;

use super::codes;
use super::limits::{check_prompt_tokens_of, output_cap, Limits};
use super::raw::{fail, Field, Raw};
use super::tokens::token_ids;

/// A float interval; an infinite bound means "no bound on that side".
#[derive(Copy, Clone, Debug)]
pub(crate) struct FloatRange {
    lo: f64,
    lo_open: bool,
    hi: f64,
    hi_open: bool,
}

impl FloatRange {
    /// `(lo, hi]`, `[lo, hi]`, ... built from the open/closed flags.
    pub(crate) const fn new(lo: f64, lo_open: bool, hi: f64, hi_open: bool) -> Self {
        FloatRange {
            lo,
            lo_open,
            hi,
            hi_open,
        }
    }

    /// True when `x` lies in the interval.
    pub(crate) fn contains(&self, x: f64) -> bool {
        let above = if self.lo_open {
            x > self.lo
        } else {
            x >= self.lo
        };
        let below = if self.hi_open {
            x < self.hi
        } else {
            x <= self.hi
        };
        above && below
    }
}

impl fmt::Display for FloatRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.lo.is_finite(), self.hi.is_finite()) {
            (true, false) => write!(f, "{} {}", if self.lo_open { ">" } else { ">=" }, self.lo),
            (false, true) => write!(f, "{} {}", if self.hi_open { "<" } else { "<=" }, self.hi),
            (false, false) => f.write_str("a finite number"),
            (true, true) => write!(
                f,
                "in {}{}, {}{}",
                if self.lo_open { "(" } else { "[" },
                self.lo,
                self.hi,
                if self.hi_open { ")" } else { "]" }
            ),
        }
    }
}

const INF: f64 = f64::INFINITY;
/// `> 0`.
pub(crate) const POSITIVE: FloatRange = FloatRange::new(0.0, true, INF, false);
/// `>= 0`.
pub(crate) const NON_NEGATIVE: FloatRange = FloatRange::new(0.0, false, INF, false);
/// `(0, 1]`.
pub(crate) const UNIT_OPEN: FloatRange = FloatRange::new(0.0, true, 1.0, false);
/// `[0, 1]`.
pub(crate) const UNIT: FloatRange = FloatRange::new(0.0, false, 1.0, false);
/// `[-2, 2]`: OpenAI presence and frequency penalties.
pub(crate) const PENALTY: FloatRange = FloatRange::new(-2.0, false, 2.0, false);
/// `(0, 2]`: MindIE `/v1` repetition penalty.
pub(crate) const REPETITION_V1: FloatRange = FloatRange::new(0.0, true, 2.0, false);
/// `[-100, 100]`: one `logit_bias` value.
pub(crate) const BIAS: FloatRange = FloatRange::new(-100.0, false, 100.0, false);
/// Any finite number.
pub(crate) const ANY: FloatRange = FloatRange::new(-INF, false, INF, false);

/// INT32_MAX, the top of most MindIE integer ranges.
pub(crate) const I32_MAX: i128 = i32::MAX as i128;

/// A float field in `range`, as the `f32` it is stored in; `hint` (may be empty) follows the
/// value in the message.
pub(crate) fn float_in(f: Field<'_>, range: FloatRange, hint: &str) -> CoreResult<Option<f32>> {
    match (f.float()?, f.raw) {
        (Some(x), Some(raw)) if !range.contains(x) => Err(fail(
            f.path,
            codes::OUT_OF_RANGE,
            format_args!("must be {range}; got {raw}{hint}"),
        )),
        (x, _) => Ok(x.map(|x| x as f32)),
    }
}

/// The `timeout` extra of the `/v1` and Databricks routes, in seconds.
pub(crate) const TIMEOUT_EXTRA: FloatRange = FloatRange::new(0.0, true, 3600.0, false);

/// The `timeout` extra of the `/v1` and Databricks routes: seconds in (0, 3600] (MindIE's
/// range, fractions allowed), a wall-clock deadline counted from arrival, queue time included
/// (docs/decisions.md#request-timeouts). Absent or null = the server's `request_timeout`.
pub(crate) fn timeout_extra(f: Field<'_>) -> CoreResult<Option<f64>> {
    match (f.float()?, f.raw) {
        (Some(x), Some(raw)) if !TIMEOUT_EXTRA.contains(x) => Err(fail(
            f.path,
            codes::OUT_OF_RANGE,
            format_args!("must be {TIMEOUT_EXTRA} seconds; got {raw}"),
        )),
        (x, _) => Ok(x),
    }
}

/// An integer field in `[lo, hi]`.
pub(crate) fn int_in(f: Field<'_>, lo: i128, hi: i128) -> CoreResult<Option<i128>> {
    match f.int()? {
        Some(i) if i < lo || i > hi => Err(f.bad(codes::OUT_OF_RANGE, describe_ints(lo, hi))),
        i => Ok(i),
    }
}

/// "must be in [lo, hi]", or "must be >= lo" when `hi` is unbounded.
pub(crate) fn describe_ints(lo: i128, hi: i128) -> String {
    if hi == i128::MAX {
        format!("must be an integer >= {lo}")
    } else {
        format!("must be an integer in [{lo}, {hi}]")
    }
}

/// An integer field in `[lo, hi]` (with `hi <= u32::MAX`), narrowed.
pub(crate) fn u32_in(f: Field<'_>, lo: u32, hi: u32) -> CoreResult<Option<u32>> {
    Ok(int_in(f, lo.into(), hi.into())?.map(|i| i as u32))
}

/// A seed: an exact integer in `[lo, 2^64 - 1]` (`lo` is 1 on routes that reject 0,
/// docs/decisions.md#seed-ranges).
pub(crate) fn seed(f: Field<'_>, lo: u64) -> CoreResult<Option<u64>> {
    Ok(int_in(f, lo.into(), u64::MAX.into())?.map(|i| i as u64))
}

/// Top-k as the sampler wants it: 0 (off) for anything that does not restrict the vocabulary
/// (`k <= 0`, `k >= vocab_size` when the vocabulary is known, or beyond `u32`).
pub(crate) fn normalise_top_k(k: i128, vocab_size: u32) -> u32 {
    let beyond_vocab = vocab_size > 0 && k >= i128::from(vocab_size);
    if k <= 0 || beyond_vocab || k > i128::from(u32::MAX) {
        0
    } else {
        k as u32
    }
}

/// Top-k of the OpenAI-style routes: -1 (off) or an integer in `[1, hi]`; 0 is rejected.
pub(crate) fn top_k_minus_one_or_positive(
    f: Field<'_>,
    hi: i128,
    limits: &Limits,
) -> CoreResult<u32> {
    match f.int()? {
        None => Ok(0),
        Some(k) if k == -1 || (1..=hi).contains(&k) => Ok(normalise_top_k(k, limits.vocab_size)),
        Some(_) => Err(f.bad(
            codes::OUT_OF_RANGE,
            format_args!("must be -1 (no limit) or an integer in [1, {hi}]"),
        )),
    }
}

/// Switches to greedy decoding: temperature 0, and the truncation samplers off (they cannot
/// change an argmax, and leaving them on would only cost time). Penalties and biases stay.
pub(crate) fn make_greedy(p: &mut SamplingParams) {
    p.temperature = 0.0;
    p.top_k = 0;
    p.top_p = 1.0;
    p.min_p = 0.0;
    p.typical_p = 1.0;
}

/// The route's token-dependent rules, applied last. With `prompt_tokens`: the prompt-token limit
/// (docs/api/common.md#prompt-limits; the error names `prompt_field`) and the output cap
/// (docs/api/common.md#output-cap); without: the cap by `max_iter_times` alone. `requested` is the
/// client's cap or the route default (None where the route has none). `min_tokens` is clamped to
/// the cap so that it never exceeds it.
pub(crate) fn apply_output_cap(
    p: &mut SamplingParams,
    requested: Option<u64>,
    prompt_tokens: Option<u32>,
    prompt_field: &str,
    limits: &Limits,
) -> CoreResult<()> {
    if let Some(n) = prompt_tokens {
        check_prompt_tokens_of(prompt_field, n, limits)?;
    }
    let cap = output_cap(requested, prompt_tokens, limits);
    p.max_tokens = Some(cap);
    p.min_tokens = p.min_tokens.min(cap);
    Ok(())
}

/// `include_stop_str_in_output` is ignored unless `stop` or `stop_token_ids` gives something
/// to include (docs/api/common.md#stop-conditions).
pub(crate) fn settle_include_stop_str(p: &mut SamplingParams) {
    if p.stop.is_empty() && p.stop_token_ids.is_empty() {
        p.include_stop_str_in_output = false;
    }
}

/// The prompt's text length in characters (code points) must satisfy
/// `0 < chars <= max_prompt_chars` (docs/api/common.md#prompt-limits); `f` is the field the text
/// came from.
pub(crate) fn prompt_chars(f: Field<'_>, chars: usize, limits: &Limits) -> CoreResult<()> {
    if chars == 0 {
        return Err(fail(
            f.path,
            codes::EMPTY,
            "must contain some text; got none",
        ));
    }
    let max = limits.max_prompt_chars as usize;
    if chars > max {
        return Err(fail(
            f.path,
            codes::TOO_LONG,
            format_args!("must be at most {max} characters; got {chars}"),
        ));
    }
    Ok(())
}

/// A required prompt: a string, or a non-empty list of strings (a batch,
/// docs/decisions.md#prompt-lists), each checked by [`prompt_chars`]. With `token_ids` (the `/v1`
/// completions route, as OpenAI and vLLM) it may also be a list of token ids (one prompt) or a list
/// of such lists (a batch), each id in the vocabulary.
pub(crate) fn prompts(f: Field<'_>, limits: &Limits, token_ids: bool) -> CoreResult<()> {
    let want = if token_ids {
        "a string, a list of strings, a list of token ids or a list of token-id lists"
    } else {
        "a string or a list of strings"
    };
    match f.raw {
        None => Err(f.missing()),
        Some(Raw::Str(s)) => prompt_chars(f, s.chars().count(), limits),
        Some(Raw::List(items)) => {
            if items.is_empty() {
                return Err(f.bad(codes::EMPTY, "must not be an empty list"));
            }
            if token_ids && is_token_id_list(items) {
                return prompt_token_ids(f, limits);
            }
            let lists = token_ids && matches!(items[0], Raw::List(_));
            for (i, item) in items.iter().enumerate() {
                let item = Field::new(f.path.index(i), Some(item));
                if lists {
                    match item.raw {
                        Some(Raw::List(_)) => prompt_token_ids(item, limits)?,
                        _ => return Err(item.wrong_type("a list of token ids, as the others")),
                    }
                    continue;
                }
                let Some(s) = item.str()? else {
                    return Err(item.wrong_type("a string"));
                };
                prompt_chars(item, s.chars().count(), limits)?;
            }
            Ok(())
        }
        Some(_) => Err(f.wrong_type(want)),
    }
}

/// True when a prompt list is one prompt of token ids (its first item is an integer), not a
/// batch.
pub(crate) fn is_token_id_list(items: &[Raw]) -> bool {
    matches!(items.first(), Some(Raw::Int(_)))
}

/// One prompt given as token ids: non-empty, each id in the vocabulary.
fn prompt_token_ids(f: Field<'_>, limits: &Limits) -> CoreResult<()> {
    token_ids(f, limits, true).map(|_| ())
}
