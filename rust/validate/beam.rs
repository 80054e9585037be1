//! Beam-search options shared by the routes that offer beam search (`/v1/completions`, the
//! offline API, TensorRT-LLM's tensors): `length_penalty` and `early_stopping`, and the rule
//! that beam search does not sample, so the sampling filters must be left at their neutral
//! values (a request that sets them would otherwise be quietly served as something else).

use super::codes;
use super::common::{float_in, ANY};
use super::raw::{Field, Obj, Raw};
use crate::error::CoreResult;
use crate::params::{EarlyStopping, SamplingParams};

/// Reads `length_penalty` and `early_stopping` (`true`, `false` or `"never"`) into `p`; with
/// `p.use_beam_search` also checks the sampling filters. Without beam search a non-default
/// beam option is refused, naming it: it would have no effect.
pub(crate) fn beam_options(o: &Obj<'_>, p: &mut SamplingParams) -> CoreResult<()> {
    let length = o.field("length_penalty");
    p.length_penalty = float_in(length, ANY, "")?.unwrap_or(1.0);
    let early = o.field("early_stopping");
    p.early_stopping = early_stopping(&early)?.unwrap_or_default();
    if !p.use_beam_search {
        let given = [
            (length, p.length_penalty != 1.0),
            (early, p.early_stopping != EarlyStopping::Heuristic),
        ];
        if let Some((f, _)) = given.into_iter().find(|(_, set)| *set) {
            return Err(f.bad(codes::CONFLICT, "acts only with `use_beam_search: true`"));
        }
        return Ok(());
    }
    no_sampling_filters(o, p)
}

/// `early_stopping`: `false` (the default heuristic), `true`, or the string `"never"`.
fn early_stopping(f: &Field<'_>) -> CoreResult<Option<EarlyStopping>> {
    match f.raw {
        None => Ok(None),
        Some(Raw::Bool(true)) => Ok(Some(EarlyStopping::Finished)),
        Some(Raw::Bool(false)) => Ok(Some(EarlyStopping::Heuristic)),
        Some(Raw::Str(s)) if s == "never" => Ok(Some(EarlyStopping::Never)),
        Some(_) => Err(f.bad(codes::INVALID_VALUE, "must be true, false or \"never\"")),
    }
}

/// TRT-LLM's integer `early_stopping`: 1 = stop once `beam_width` hypotheses are finished, 0 =
/// the heuristic, any other value = never (SamplingConfig `earlyStopping`).
pub(crate) fn early_stopping_from_int(value: i128) -> EarlyStopping {
    match value {
        0 => EarlyStopping::Heuristic,
        1 => EarlyStopping::Finished,
        _ => EarlyStopping::Never,
    }
}

/// Beam search keeps the most likely continuations; it draws nothing, so `top_k`, `top_p`,
/// `min_p` and `typical_p` have nothing to act on and must stay off. (The temperature does act:
/// it scales the logits before their log-softmax, 0 meaning unscaled.)
pub(crate) fn no_sampling_filters(o: &Obj<'_>, p: &SamplingParams) -> CoreResult<()> {
    let filters = [
        ("top_k", p.top_k != 0),
        ("top_p", p.top_p < 1.0),
        ("min_p", p.min_p > 0.0),
        ("typical_p", p.typical_p < 1.0),
    ];
    match filters.into_iter().find(|(_, on)| *on) {
        Some((key, _)) => Err(o.field(key).bad(
            codes::CONFLICT,
            "cannot be used with beam search, which does not sample (leave it out)",
        )),
        None => Ok(()),
    }
}
