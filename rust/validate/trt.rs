//! The TensorRT-LLM-style in-process request (docs/api/trt.md). Tensors arrive as Python
//! values after the wrapper flattened them: a `[1]` or `[1, 1]` tensor may be a scalar or a
//! one-element (nested) list (docs/decisions.md#tensor-shapes). The pybind names `max_new_tokens`,
//! `length_penalty` and `is_streaming` are accepted as aliases of the tensor names
//! (docs/decisions.md#pybind-names).
//!
//! Semantics follow TRT-LLM, not the HTTP APIs: absent `runtime_top_k` and `runtime_top_p`
//! are both 0, which is greedy (docs/decisions.md#absent-top-k-and-top-p); `runtime_top_p` 0 with a
//! top-k is plain top-k; `random_seed` defaults to 0; `end_id` defaults to -1, so EOS ends a
//! sequence only when `end_id` names it (docs/decisions.md#the-end-id-default).

use crate::error::CoreResult;
use crate::params::{EarlyStopping, SamplingParams};
use crate::types::TokenId;

use super::beam::early_stopping_from_int;
use super::codes;
use super::common::{
    apply_output_cap, float_in, int_in, make_greedy, normalise_top_k, seed, u32_in, ANY, I32_MAX,
    NON_NEGATIVE, POSITIVE, UNIT,
};
use super::limits::Limits;
use super::raw::{fail, Field, Obj, Raw};
use super::request::{read_switches, OutputCap, ValidRequest};
use super::tokens::{embedding_bias, token_id, token_ids};
use super::Route;

/// `len_penalty` (alias `length_penalty`) and `early_stopping` (docs/api/trt.md#sampling), which
/// act only with `beam_width` > 1; beam search does not sample, so `runtime_top_k` /
/// `runtime_top_p` must then stay off.
fn beam_options(o: &Obj<'_>, p: &mut SamplingParams) -> CoreResult<()> {
    let length = scalar(aliased(o, "len_penalty", "length_penalty")?)?;
    // TRT's default length penalty is 0: beams are ranked by their cumulative logprob.
    p.length_penalty = float_in(length, ANY, "")?.unwrap_or(0.0);
    let early = scalar(o.field("early_stopping"))?;
    let early_value = int_in(early, i32::MIN.into(), I32_MAX)?;
    p.early_stopping = early_value.map_or(EarlyStopping::Heuristic, early_stopping_from_int);
    if !p.use_beam_search {
        // 0 (TRT's default) and 1 leave a single sequence unchanged; others need beams.
        if p.length_penalty != 0.0 && p.length_penalty != 1.0 {
            return Err(length.bad(codes::CONFLICT, "acts only with `beam_width` > 1"));
        }
        if early_value.is_some_and(|v| v != 0) {
            return Err(early.bad(codes::CONFLICT, "acts only with `beam_width` > 1"));
        }
        return Ok(());
    }
    let filters = [
        ("runtime_top_k", p.top_k != 0),
        ("runtime_top_p", p.top_p < 1.0),
    ];
    match filters.into_iter().find(|(_, on)| *on) {
        Some((key, _)) => Err(scalar(o.field(key))?.bad(
            codes::CONFLICT,
            "cannot be used with `beam_width` > 1: beam search does not sample (send 0)",
        )),
        None => Ok(()),
    }
}

/// TRT-LLM's largest top-k.
const MAX_TOP_K: u32 = 1024;

/// Validates a TRT request's tensors.
pub(super) fn trt(body: &Raw, limits: &Limits) -> CoreResult<ValidRequest> {
    let o = Obj::root(body)?;
    let num_virtual = prompt_tuning(&o)?;
    let input = o.field("input_ids");
    let input_limits = Limits {
        vocab_size: limits.vocab_size.saturating_add(num_virtual),
        ..limits.clone()
    };
    let input_ids =
        token_ids(one_row(input)?, &input_limits, true)?.ok_or_else(|| input.missing())?;
    let out_len = aliased(&o, "request_output_len", "max_new_tokens")?;
    let out_len = u32_in(scalar(out_len)?, 1, I32_MAX as u32)?.ok_or_else(|| out_len.missing())?;
    scalar(aliased(&o, "streaming", "is_streaming")?)?.bool()?;
    let beam_width = u32_in(scalar(o.field("beam_width"))?, 1, limits.max_beam_width)?;
    let (mut p, greedy) = sampling(&o, limits)?;
    if let Some(width) = beam_width.filter(|&w| w > 1) {
        p.use_beam_search = true;
        p.n = width;
        p.best_of = width;
    } else if greedy {
        make_greedy(&mut p);
    }
    beam_options(&o, &mut p)?;
    end_id(&o, &mut p, limits)?;
    p.bad_words = word_list(o.field("bad_words_list"), limits)?;
    p.stop_token_sequences = word_list(o.field("stop_words_list"), limits)?;
    p.embedding_bias = embedding_bias(o.field("embedding_bias"), limits)?;
    p.logprobs = scalar(o.field("return_log_probs"))?
        .bool()?
        .unwrap_or(false)
        .then_some(0);
    extras(&o, limits)?;
    let num_prompt = u32::try_from(input_ids.len()).unwrap_or(u32::MAX);
    apply_output_cap(
        &mut p,
        Some(out_len.into()),
        Some(num_prompt),
        "input_ids",
        limits,
    )?;
    let switches = read_switches(Route::Trt, body)?;
    if switches.grammar.is_some() {
        // A guided output ends where its guide does, on the model's EOS: it must not be banned.
        if p.stop_token_ids.is_empty() {
            let f = o.field("end_id");
            return Err(f.bad(
                codes::MISSING,
                "must be given (the model's EOS id) with `guided_decoding_guide_type`: a guided output ends where its guide does",
            ));
        }
        p.ignore_eos = false;
    }
    ValidRequest::new(Route::Trt, p, switches, OutputCap::Applied, limits)
}

/// The sampling scalars, and whether TRT's decoding-mode rule makes them greedy
/// (docs/api/trt.md#sampling: top-k 0 and top-p 0; or temperature 0).
fn sampling(o: &Obj<'_>, limits: &Limits) -> CoreResult<(SamplingParams, bool)> {
    let float = |key: &'static str, range, default: f32| -> CoreResult<f32> {
        Ok(float_in(scalar(o.field(key))?, range, "")?.unwrap_or(default))
    };
    let top_k = u32_in(scalar(o.field("runtime_top_k"))?, 0, MAX_TOP_K)?.unwrap_or(0);
    let top_p = float("runtime_top_p", UNIT, 0.0)?;
    let p = SamplingParams {
        temperature: float("temperature", NON_NEGATIVE, 1.0)?,
        repetition_penalty: float("repetition_penalty", POSITIVE, 1.0)?,
        presence_penalty: float("presence_penalty", ANY, 0.0)?,
        frequency_penalty: float("frequency_penalty", ANY, 0.0)?,
        min_tokens: u32_in(scalar(o.field("min_length"))?, 0, I32_MAX as u32)?.unwrap_or(0),
        no_repeat_ngram_size: u32_in(scalar(o.field("no_repeat_ngram_size"))?, 0, I32_MAX as u32)?
            .unwrap_or(0),
        seed: Some(seed(scalar(o.field("random_seed"))?, 0)?.unwrap_or(0)),
        top_k: normalise_top_k(top_k.into(), limits.vocab_size),
        // TRT's top-p 0 means "off", which is 1 here.
        top_p: if top_p == 0.0 { 1.0 } else { top_p },
        ..SamplingParams::default()
    };
    let greedy = (top_k == 0 && top_p == 0.0) || p.temperature == 0.0;
    Ok((p, greedy))
}

/// `end_id`: -1 (the default: no EOS) or a token id. EOS handling is explicit on this route,
/// so `ignore_eos` is set and a given `end_id` becomes the stop token
/// (docs/decisions.md#the-end-id-default).
fn end_id(o: &Obj<'_>, p: &mut SamplingParams, limits: &Limits) -> CoreResult<()> {
    let f = scalar(o.field("end_id"))?;
    p.ignore_eos = true;
    match f.int()? {
        None | Some(-1) => {}
        Some(_) => {
            p.stop_token_ids = vec![token_id(f, limits).map_err(|_| {
                f.bad(
                    codes::OUT_OF_RANGE,
                    "must be -1 or a token id below the vocabulary size",
                )
            })?]
        }
    }
    Ok(())
}

/// The tensors that do not change sampling, checked for type and shape.
fn extras(o: &Obj<'_>, limits: &Limits) -> CoreResult<()> {
    int_in(scalar(o.field("pad_id"))?, i32::MIN.into(), I32_MAX)?;
    seed(scalar(o.field("lora_task_id"))?, 0)?;
    for key in ["return_context_logits", "return_generation_logits"] {
        scalar(o.field(key))?.bool()?;
    }
    let lora_config = o.field("lora_config");
    let config_rows = matrix(lora_config, Some(3))?;
    let weights = o.field("lora_weights");
    let weight_rows = matrix(weights, None)?;
    if let (Some(c), Some(w)) = (config_rows, weight_rows) {
        if c != w {
            return Err(weights.bad(
                codes::INVALID_FORMAT,
                format_args!("must have one row per `lora_config` row ({c}); it has {w}"),
            ));
        }
    }
    let draft = o.field("draft_input_ids");
    let num_draft = token_ids(draft, limits, false)?.map(|ids| ids.len());
    let logits = o.field("draft_logits");
    let vocab = (limits.vocab_size > 0).then_some(limits.vocab_size as usize);
    if let Some(rows) = matrix(logits, vocab)? {
        if Some(rows) != num_draft {
            return Err(logits.bad(
                codes::INVALID_FORMAT,
                "must have one row per `draft_input_ids` entry",
            ));
        }
    }
    lora_fields(o)
}

/// LoRA (docs/api/trt.md#lora): `lora_weights` and `lora_config` come together, with the
/// `lora_task_id` they are cached under; the id alone names a cached adapter (the executor
/// checks the rows against the model and the cache).
fn lora_fields(o: &Obj<'_>) -> CoreResult<()> {
    let (id, weights, config) = (
        o.field("lora_task_id"),
        o.field("lora_weights"),
        o.field("lora_config"),
    );
    for (f, other, name) in [
        (weights, config, "lora_config"),
        (config, weights, "lora_weights"),
    ] {
        if f.is_set() && !other.is_set() {
            return Err(f.bad(codes::CONFLICT, format_args!("needs `{name}` with it")));
        }
    }
    if weights.is_set() && !id.is_set() {
        return Err(weights.bad(
            codes::CONFLICT,
            "needs a `lora_task_id` to cache the adapter under",
        ));
    }
    Ok(())
}

/// P-tuning (docs/api/trt.md#prompt-tuning): `prompt_embedding_table` `[rows, hidden]` with
/// `prompt_vocab_size` (default: its row count, at most that). Returns the number of virtual token
/// ids (`vocab_size..vocab_size + prompt_vocab_size`) `input_ids` may use; 0 without a table.
fn prompt_tuning(o: &Obj<'_>) -> CoreResult<u32> {
    let size = scalar(o.field("prompt_vocab_size"))?;
    let size_value = u32_in(size, 1, I32_MAX as u32)?;
    let table = o.field("prompt_embedding_table");
    let Some(rows) = matrix(table, None)? else {
        return match size_value {
            Some(_) => Err(size.bad(codes::CONFLICT, "needs a `prompt_embedding_table`")),
            None => Ok(0),
        };
    };
    let width = match table.raw {
        Some(Raw::List(r)) => match r.first() {
            Some(Raw::List(first)) => first.len(),
            _ => 0,
        },
        _ => 0,
    };
    if rows == 0 || width == 0 {
        return Err(table.bad(
            codes::EMPTY,
            "must be `[rows, hidden_size]` with at least one row and one column",
        ));
    }
    let rows = u32::try_from(rows).unwrap_or(u32::MAX);
    match size_value {
        Some(n) if n > rows => Err(size.bad(
            codes::OUT_OF_RANGE,
            format_args!("must be at most the rows of `prompt_embedding_table` ({rows}); got {n}"),
        )),
        Some(n) => Ok(n),
        None => Ok(rows),
    }
}

/// A tensor under its canonical name or its pybind alias; both at once conflict.
fn aliased<'a>(o: &'a Obj<'a>, name: &'a str, alias: &'a str) -> CoreResult<Field<'a>> {
    let (canonical, other) = (o.field(name), o.field(alias));
    match (canonical.is_set(), other.is_set()) {
        (true, true) => Err(other.bad(
            codes::CONFLICT,
            format_args!("is an alias of `{name}`; give only one of them"),
        )),
        (false, true) => Ok(other),
        _ => Ok(canonical),
    }
}

/// A `[1]` or `[1, 1]` tensor as its one value (a bare scalar passes through).
pub(super) fn scalar(f: Field<'_>) -> CoreResult<Field<'_>> {
    let mut raw = f.raw;
    while let Some(Raw::List(items)) = raw {
        match items.as_slice() {
            [one] => raw = Some(one),
            _ => return Err(f.bad(codes::INVALID_FORMAT, "must hold exactly one value")),
        }
    }
    Ok(Field::new(f.path, raw))
}

/// A `[N]` or `[1, N]` tensor as its one row.
fn one_row(f: Field<'_>) -> CoreResult<Field<'_>> {
    match f.raw {
        Some(Raw::List(rows)) => match rows.as_slice() {
            [Raw::List(_)] => Ok(Field::new(f.path, rows.first())),
            rows if rows.iter().any(|r| matches!(r, Raw::List(_))) => {
                Err(f.bad(codes::INVALID_FORMAT, "must be a 1-D list or a single row"))
            }
            _ => Ok(f),
        },
        _ => Ok(f),
    }
}

/// A 2-D list of numbers with rows of one length (`width` when given); returns the row count.
fn matrix(f: Field<'_>, width: Option<usize>) -> CoreResult<Option<usize>> {
    let Some(rows) = f.list()? else {
        return Ok(None);
    };
    let want = width.or_else(|| match rows.first() {
        Some(Raw::List(first)) => Some(first.len()),
        _ => None,
    });
    for (i, row) in rows.iter().enumerate() {
        let row_field = Field::new(f.path.index(i), Some(row));
        let ok = match row {
            Raw::List(cells) => {
                Some(cells.len()) == want
                    && cells
                        .iter()
                        .all(|c| matches!(c, Raw::Int(_) | Raw::Float(_)))
            }
            _ => false,
        };
        if !ok {
            let width = want.map_or("equal".to_string(), |w| w.to_string());
            return Err(fail(
                row_field.path,
                codes::INVALID_FORMAT,
                format_args!("must be a row of {width} numbers"),
            ));
        }
    }
    Ok(Some(rows.len()))
}

/// Whether a word list is the batched `[batch, 2, L]` form: a list of (non-empty) lists of lists.
fn is_batched(rows: &[Raw]) -> bool {
    let nested = |r: &Raw| match r {
        Raw::List(b) => !b.is_empty() && b.iter().all(|x| matches!(x, Raw::List(_))),
        _ => false,
    };
    !rows.is_empty() && rows.iter().all(nested)
}

/// A `[2, L]` word list (or the batched `[batch, 2, L]`): row 0 the words' token ids concatenated and padded,
/// row 1 each word's cumulative end offset, padded with -1 (docs/api/trt.md#word-lists). Offsets
/// must be strictly increasing, within row 0, and -1 only at the end.
fn word_list(f: Field<'_>, limits: &Limits) -> CoreResult<Vec<Vec<TokenId>>> {
    let Some(rows) = f.list()? else {
        return Ok(Vec::new());
    };
    if is_batched(rows) {
        // The batched form `[batch, 2, L]`: every item's words (a request is one batch entry
        // in TRT; more items add their words).
        let mut words = Vec::new();
        for (b, item) in rows.iter().enumerate() {
            words.extend(word_list(Field::new(f.path.index(b), Some(item)), limits)?);
        }
        return Ok(words);
    }
    let bad = |rule: &str| {
        fail(
            f.path,
            codes::INVALID_FORMAT,
            format_args!("{rule} (docs/api/trt.md#word-lists)"),
        )
    };
    let [Raw::List(ids), Raw::List(offsets)] = rows else {
        return Err(bad("must be two rows: token ids and end offsets"));
    };
    if ids.len() != offsets.len() {
        return Err(bad("must have two rows of the same length"));
    }
    let mut words = Vec::new();
    let mut start = 0usize;
    let mut ended = false;
    for (i, offset) in offsets.iter().enumerate() {
        let off = Field::new(f.path.index(1), Some(offset));
        let off = match off.int()? {
            Some(-1) => {
                ended = true;
                continue;
            }
            Some(o) if !ended && o > start as i128 && o <= ids.len() as i128 => o as usize,
            _ => return Err(bad(&format!("has a bad end offset at [1][{i}]: offsets must increase, stay within row 0, and be followed only by -1"))),
        };
        let mut word = Vec::with_capacity(off - start);
        for (j, id) in ids.iter().enumerate().take(off).skip(start) {
            let row = f.path.index(0);
            word.push(token_id(Field::new(row.index(j), Some(id)), limits)?);
        }
        words.push(word);
        start = off;
    }
    Ok(words)
}
