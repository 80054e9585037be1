//! One beam-search step's selection: each live beam's next-token log-probabilities, added to
//! the beam's score, and the best continuations over all beams.
//!
//! Per beam, as HF transformers' `_beam_search` (do_sample=False): the raw logits divided by the
//! temperature (when positive and not 1), their log-softmax, then the logits processors (steps
//! 1-7 of the sampler: biases, allowed ids, bad words, `min_tokens`, no-repeat n-grams,
//! repetition/presence/frequency penalties) applied to those log-probabilities without
//! renormalising. The candidates are the `keep` best `(beam score + logprob)` over every beam
//! and token, best first, ties by beam then token id. Beams run in parallel; the result does
//! not depend on it.

use std::cmp::Ordering;

use rayon::prelude::*;

use super::kernels::divide;
use super::logprobs::{top_logprobs, LogSoftmax};
use super::processors::{check_params, process_steps};
use super::scratch::with_scratch;
use super::select::top_by_value;
use super::SampleRequest;
use crate::error::{CoreError, CoreResult};
use crate::types::TokenId;

/// One live beam: its logits row, its history (in `req`; `req.row` is ignored) and score.
#[derive(Clone, Copy, Debug)]
pub struct BeamRow<'a> {
    /// The beam's logits for its next token.
    pub logits: &'a [f32],
    /// Parameters, prompt, output so far and EOS ids, as for a draw.
    pub req: SampleRequest<'a>,
    /// The beam's score: the sum of its tokens' processed logprobs.
    pub score: f32,
}

/// A continuation of one beam by one token.
#[derive(Clone, Debug, PartialEq)]
pub struct BeamCandidate {
    /// Index of the beam (into the rows given) it continues.
    pub beam: usize,
    /// The token appended.
    pub token: TokenId,
    /// The beam's score plus the token's processed logprob.
    pub score: f32,
    /// The token's processed logprob.
    pub logprob: f32,
    /// The beam's `logprobs` best alternatives at this position (empty unless asked for).
    pub top_logprobs: Vec<(TokenId, f32)>,
}

/// The `keep` best continuations of `beams`, best first; `num_top` alternatives per candidate's
/// position when logprobs are asked for. Candidates at `-inf` (tokens a processor banned) are
/// never returned, so fewer than `keep` come back when fewer are possible. Fails when a beam's
/// row does not hold `vocab` values or its parameters do not fit it.
pub fn beam_candidates(
    beams: &[BeamRow<'_>],
    vocab: usize,
    keep: usize,
    num_top: Option<u32>,
) -> CoreResult<Vec<BeamCandidate>> {
    for b in beams {
        if b.logits.len() != vocab {
            return Err(CoreError::invalid(
                "logits",
                "bad_shape",
                format!(
                    "a beam's logits row must hold `vocab` = {vocab} values; got {}",
                    b.logits.len()
                ),
            ));
        }
        check_params(b.req.params, vocab)?;
    }
    let per_beam = |(i, b): (usize, &BeamRow<'_>)| best_of_beam(i, b, keep, num_top);
    let mut all: Vec<BeamCandidate> = if beams.len() == 1 {
        beams.iter().enumerate().flat_map(per_beam).collect()
    } else {
        let lists: Vec<Vec<BeamCandidate>> = beams.par_iter().enumerate().map(per_beam).collect();
        lists.into_iter().flatten().collect()
    };
    all.sort_by(order);
    all.truncate(keep);
    Ok(all)
}

/// Best first: higher score, then the lower beam, then the lower token id.
fn order(a: &BeamCandidate, b: &BeamCandidate) -> Ordering {
    b.score
        .partial_cmp(&a.score)
        .unwrap_or(Ordering::Equal)
        .then(a.beam.cmp(&b.beam))
        .then(a.token.cmp(&b.token))
}

/// The `keep` best continuations of one beam (only these can be among the best overall).
fn best_of_beam(
    index: usize,
    beam: &BeamRow<'_>,
    keep: usize,
    num_top: Option<u32>,
) -> Vec<BeamCandidate> {
    with_scratch(beam.logits.len(), |s| {
        let row = &mut s.row;
        row.copy_from_slice(beam.logits);
        let t = beam.req.params.temperature;
        if t > 0.0 && t != 1.0 {
            divide(row, t);
        }
        let lsm = LogSoftmax::of(row);
        for v in row.iter_mut() {
            *v = lsm.logprob(*v);
        }
        process_steps(row, &beam.req, &mut s.proc);
        let top = match num_top {
            Some(k) => top_logprobs(row, k as usize, &mut s.head),
            None => Vec::new(),
        };
        top_by_value(row, super::kernels::Unit, keep, &mut s.cands);
        s.cands
            .iter()
            .map(|c| BeamCandidate {
                beam: index,
                token: c.id,
                score: beam.score + c.w,
                logprob: c.w,
                top_logprobs: top.clone(),
            })
            .collect()
    })
}
