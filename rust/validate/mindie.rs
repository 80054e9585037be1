//! MindIE `generate` / `generate_stream` (docs/api/mindie.md#request,
//! docs/api/mindie.md#generate-response): `{id, text_input, parameters: {...}}`.

use crate::error::CoreResult;
use crate::params::SamplingParams;

use super::request::{routed, ValidRequest};
use super::Route;

use super::codes;
use super::common::{
    float_in, int_in, make_greedy, normalise_top_k, prompt_chars, seed, I32_MAX, POSITIVE,
    UNIT_OPEN,
};
use super::limits::Limits;
use super::messages::{content, MediaCount, PartRules, GENERATE_PARTS};
use super::raw::{Field, Obj, Raw};

/// Default `max_new_tokens` (docs/api/mindie.md#request).
const DEFAULT_MAX_NEW_TOKENS: u64 = 20;
/// Default `timeout` in seconds, and the largest allowed.
const DEFAULT_TIMEOUT_S: i128 = 600;
const MAX_TIMEOUT_S: i128 = 3600;
/// Longest client `id`.
const MAX_ID_LEN: usize = 256;

/// Validates a generate / generate_stream body.
pub(super) fn generate(body: &Raw, limits: &Limits) -> CoreResult<ValidRequest> {
    let o = Obj::root(body)?;
    request_id(o.field("id"))?;
    text_input(o.field("text_input"), limits)?;
    let params = o.field("parameters");
    let q = params.obj()?.unwrap_or(Obj {
        path: params.path,
        entries: &[],
    });
    let mut p = sampling(&q, limits)?;
    q.field("details").bool()?;
    // Fields without effect (docs/decisions.md#fields-without-effect): checked, then ignored.
    int_in(q.field("batch_size"), 1, I32_MAX)?;
    q.field("watermark").bool()?;
    q.field("perf_stat").bool()?;
    p.priority = int_in(q.field("priority"), 1, 5)?.map_or(5, |v| v as u8);
    let timeout = int_in(q.field("timeout"), 1, MAX_TIMEOUT_S)?.unwrap_or(DEFAULT_TIMEOUT_S);
    p.timeout_s = Some(timeout as f64);
    let max_new = int_in(q.field("max_new_tokens"), 1, I32_MAX)?;
    let requested = max_new.map_or(DEFAULT_MAX_NEW_TOKENS, |m| m as u64);
    routed(
        Route::Generate,
        body,
        p,
        Some(requested),
        "text_input",
        limits,
    )
}

/// The client's request id: `^[A-Za-z0-9_-]{1,256}$`.
fn request_id(f: Field<'_>) -> CoreResult<()> {
    let Some(id) = f.str()? else {
        return Ok(());
    };
    let well_formed = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !well_formed {
        return Err(f.bad(
            codes::INVALID_FORMAT,
            "must be 1 to 256 characters from A-Z, a-z, 0-9, '_' and '-'",
        ));
    }
    Ok(())
}

/// `text_input`: a non-empty string, or content parts (text, and at most one image on a
/// multimodal model); the text is at most `max_prompt_chars` characters.
fn text_input(f: Field<'_>, limits: &Limits) -> CoreResult<()> {
    let rules = PartRules {
        media: GENERATE_PARTS,
        multimodal: limits.multimodal,
        max_media: 1,
        media_name: "image",
    };
    let chars = content(f, &rules, &mut MediaCount::default())?;
    prompt_chars(f, chars.ok_or_else(|| f.missing())?, limits)
}

/// The sampling fields of `parameters`, with the do_sample rule
/// (docs/decisions.md#when-generate-samples): `false` is greedy (temperature, top_k, top_p and
/// typical_p ignored; repetition_penalty still applies), `true` samples, and when absent the
/// request samples only if temperature != 1, 0 < top_k < vocab_size, top_p < 1 or typical_p is
/// given. typical_p is validated and then ignored, as MindIE's post-processing does not support it
/// (docs/decisions.md#fields-without-effect).
fn sampling(q: &Obj<'_>, limits: &Limits) -> CoreResult<SamplingParams> {
    let mut p = SamplingParams {
        repetition_penalty: float_in(q.field("repetition_penalty"), POSITIVE, "")?.unwrap_or(1.0),
        seed: seed(q.field("seed"), 1)?,
        ..SamplingParams::default()
    };
    let do_sample = q.field("do_sample").bool()?;
    let hint = " (use do_sample=false for greedy decoding)";
    let temperature = float_in(q.field("temperature"), POSITIVE, hint)?;
    let top_k = int_in(q.field("top_k"), 0, I32_MAX)?;
    let top_p = float_in(q.field("top_p"), UNIT_OPEN, "")?;
    let typical_p = float_in(q.field("typical_p"), UNIT_OPEN, "")?;
    let top_k = top_k.map_or(0, |k| normalise_top_k(k, limits.vocab_size));
    let sample = do_sample.unwrap_or_else(|| {
        temperature.is_some_and(|t| t != 1.0)
            || top_k > 0
            || top_p.is_some_and(|t| t < 1.0)
            || typical_p.is_some()
    });
    if sample {
        p.temperature = temperature.unwrap_or(1.0);
        p.top_k = top_k;
        p.top_p = top_p.unwrap_or(1.0);
    } else {
        make_greedy(&mut p);
    }
    Ok(p)
}
