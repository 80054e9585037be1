//! The entry points: shape checks, the parallel loop over rows, and one row's pipeline.

use std::ops::Range;

use rayon::prelude::*;

use super::filters::{self, Dist};
use super::kernels::argmax;
use super::kernels::{with_scale, Unit};
use super::logprobs::{self, LogSoftmax};
use super::overlay::top_of_processed;
use super::processors::{all_sparse_req, check_params, process_in_place, process_into};
use super::rng::uniform;
use super::scratch::{with_scratch, Scratch};
use super::select::Cand;
use super::{LogprobsMode, SampleRequest, Sampled, SamplerConfig};
use crate::error::{CoreError, CoreResult};
use crate::params::SamplingParams;

/// One sample's outcome: its token, or why its row could not be sampled (its parameters do not
/// fit the row, or no finite logit was left after its processors). Such a failure belongs to
/// that sample alone.
pub type SampleResult = CoreResult<Sampled>;

/// Draws one token per request from `logits` (`[num_rows, vocab]`, row-major). Rows are
/// processed in parallel; the result is identical to a serial run and does not depend on the
/// batch's other samples or their order. The call fails as a whole on a buffer that is not a
/// whole number of rows or a row index out of range (checked before any work). Each sample then
/// succeeds or fails alone: an `embedding_bias` of the wrong length or `logprobs > 20`, or a row
/// left with no finite logit by its processors, is that sample's `Err`.
pub fn sample(
    logits: &[f32],
    vocab: usize,
    reqs: &[SampleRequest<'_>],
    cfg: &SamplerConfig,
) -> CoreResult<Vec<SampleResult>> {
    let num_rows = check_shape(logits, vocab)?;
    for (i, req) in reqs.iter().enumerate() {
        if req.row >= num_rows {
            return Err(CoreError::invalid(
                "logits",
                "row_out_of_range",
                format!(
                    "`logits` has {num_rows} rows; sample {i} asks for row {}",
                    req.row
                ),
            ));
        }
    }
    let groups = forks(reqs);
    let run = |g: &Range<usize>| {
        check_params(reqs[g.start].params, vocab)?;
        let raw = &logits[reqs[g.start].row * vocab..][..vocab];
        with_scratch(vocab, |s| {
            sample_group(raw, &reqs[g.clone()], g.start, cfg, s)
        })
    };
    // One row runs on the caller's thread: handing it to the pool only adds a wake-up.
    let per_group: Vec<CoreResult<Vec<Sampled>>> = if groups.len() == 1 {
        groups.iter().map(run).collect()
    } else {
        groups.par_iter().map(run).collect()
    };
    let mut out = Vec::with_capacity(reqs.len());
    for (group, g) in per_group.into_iter().zip(&groups) {
        match group {
            Ok(drawn) => out.extend(drawn.into_iter().map(Ok)),
            Err(e) => out.extend(g.clone().map(|_| Err(e.clone()))),
        }
    }
    Ok(out)
}

fn check_shape(logits: &[f32], vocab: usize) -> CoreResult<usize> {
    if vocab == 0 || !logits.len().is_multiple_of(vocab) {
        return Err(CoreError::invalid(
            "logits",
            "bad_shape",
            format!(
                "`logits` must hold whole rows of `vocab` = {vocab} values; got {} values",
                logits.len()
            ),
        ));
    }
    Ok(logits.len() / vocab)
}

/// Runs of consecutive samples with the same inputs (the forks of a request at its first
/// token): their filtered distribution is computed once, and only the draws differ.
fn forks(reqs: &[SampleRequest<'_>]) -> Vec<Range<usize>> {
    fn same<T>(a: &[T], b: &[T]) -> bool {
        a.as_ptr() == b.as_ptr() && a.len() == b.len()
    }
    let mut groups: Vec<Range<usize>> = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        match groups.last_mut() {
            Some(g)
                if {
                    let f = &reqs[g.start];
                    f.row == r.row
                        && std::ptr::eq(f.params, r.params)
                        && same(f.prompt, r.prompt)
                        && same(f.output, r.output)
                        && same(f.eos_token_ids, r.eos_token_ids)
                        && f.allowed.map(std::ptr::from_ref) == r.allowed.map(std::ptr::from_ref)
                } =>
            {
                g.end = i + 1
            }
            _ => groups.push(i..i + 1),
        }
    }
    groups
}

pub(super) fn no_finite(row: usize, sample: usize) -> CoreError {
    CoreError::invalid(
        format!("logits[{row}]"),
        "no_finite_logit",
        format!(
            "`logits[{row}]` has no finite value left after the logits processors \
             (sample {sample}); at least one token must stay possible"
        ),
    )
}

/// What a row's processors and filters leave to draw from.
pub(super) enum Choice {
    /// Greedy: the token, whatever the uniform.
    Greedy(u32),
    /// The filtered distribution (kept tokens in the scratch).
    Sample(Dist),
}

/// Samples a run of forks sharing one row; `first` is the index of the run's first sample.
pub(super) fn sample_group(
    raw: &[f32],
    reqs: &[SampleRequest<'_>],
    first: usize,
    cfg: &SamplerConfig,
    s: &mut Scratch,
) -> CoreResult<Vec<Sampled>> {
    let head = &reqs[0];
    let choice = choose(raw, head, cfg, s).ok_or_else(|| no_finite(head.row, first))?;
    let (tokens, dist) = match choice {
        Choice::Greedy(id) => (vec![Cand { w: 1.0, id }; reqs.len()], None),
        Choice::Sample(dist) => {
            let draw = |r: &SampleRequest<'_>, s: &mut Scratch| {
                let u = uniform(r.seed, r.sample_index, r.output.len() as u64);
                filters::draw(&dist, u, s)
            };
            (reqs.iter().map(|r| draw(r, s)).collect(), Some(dist))
        }
    };
    // Ranking best_of candidates needs the chosen token's logprob alone (no alternatives).
    let k = match head.params.logprobs {
        Some(k) => k,
        None if head.params.needs_token_logprob() => 0,
        None => return Ok(tokens.iter().map(|c| no_logprobs(c.id)).collect()),
    };
    let mode = cfg.logprobs_mode;
    Ok(with_logprobs(
        raw,
        &tokens,
        dist.as_ref(),
        k as usize,
        mode,
        s,
    ))
}

/// Runs the processors and filters of `req` on `raw`; `None` when no finite logit is left.
/// Greedy and top-k rows whose processors are all sparse never copy the row (see `overlay`),
/// unless processed logprobs of a greedy row need the whole processed row.
pub(super) fn choose(
    raw: &[f32],
    req: &SampleRequest<'_>,
    cfg: &SamplerConfig,
    s: &mut Scratch,
) -> Option<Choice> {
    let p = req.params;
    let greedy = p.is_greedy();
    let whole_row_logprobs =
        p.needs_token_logprob() && cfg.logprobs_mode == LogprobsMode::Processed;
    let in_place = all_sparse_req(req)
        && if greedy {
            !whole_row_logprobs
        } else {
            filters::top_k_active(p, raw.len())
        };
    // The filters divide by the temperature as they read (see `kernels::Scale`).
    let t = if p.temperature > 0.0 {
        p.temperature
    } else {
        1.0
    };
    let (o, ps, cands) = (&mut s.overlay, &mut s.proc, &mut s.cands);
    match (greedy, in_place) {
        (true, true) => {
            top_of_processed(raw, req, Unit, 1, o, ps, cands);
            cands.first().map(|c| Choice::Greedy(c.id))
        }
        (false, true) => {
            let k = p.top_k as usize;
            with_scale!(t, |sc| top_of_processed(raw, req, sc, k, o, ps, cands));
            filters::after_top_k(p, s).map(Choice::Sample)
        }
        (true, false) => {
            process_into(&mut s.row, raw, req, &mut s.proc);
            argmax(&s.row).map(|i| Choice::Greedy(i as u32))
        }
        (false, false) => {
            process_into(&mut s.row, raw, req, &mut s.proc);
            let row = std::mem::take(&mut s.row);
            let dist = filters::build(&row, t, p, s);
            s.row = row;
            dist.map(Choice::Sample)
        }
    }
}

pub(super) fn no_logprobs(token: u32) -> Sampled {
    Sampled {
        token,
        logprob: None,
        top_logprobs: Vec::new(),
    }
}

pub(super) fn with_logprobs(
    raw: &[f32],
    tokens: &[Cand],
    dist: Option<&Dist>,
    k: usize,
    mode: LogprobsMode,
    s: &mut Scratch,
) -> Vec<Sampled> {
    if let (LogprobsMode::Processed, Some(dist)) = (mode, dist) {
        return tokens
            .iter()
            .map(|c| {
                let (logprob, top_logprobs) = logprobs::from_dist(dist, c, k, s);
                Sampled {
                    token: c.id,
                    logprob: Some(logprob),
                    top_logprobs,
                }
            })
            .collect();
    }
    // Raw rows, and greedy rows in Processed mode (their distribution is steps 1-7's softmax).
    let row: &[f32] = if mode == LogprobsMode::Raw {
        raw
    } else {
        &s.row
    };
    let lsm = LogSoftmax::of(row);
    let top = lsm.top(row, k, &mut s.head);
    tokens
        .iter()
        .map(|c| Sampled {
            token: c.id,
            logprob: Some(lsm.logprob(row[c.id as usize])),
            top_logprobs: top.clone(),
        })
        .collect()
}

/// Steps 1-8 on one row in place (NaN -> `-inf` first): the logits the filters see. `req.row`
/// is ignored. Errors when `row.len() != vocab` or the parameters do not fit `vocab`.
pub fn process_logits(row: &mut [f32], req: &SampleRequest<'_>, vocab: usize) -> CoreResult<()> {
    if row.len() != vocab {
        return Err(CoreError::invalid(
            "logits",
            "bad_shape",
            format!(
                "`logits` row must hold `vocab` = {vocab} values; got {}",
                row.len()
            ),
        ));
    }
    check_params(req.params, vocab)?;
    with_scratch(vocab, |s| process_in_place(row, req, &mut s.proc));
    Ok(())
}

/// Steps 9-12 over a processed row (the output of [`process_logits`]): the exact distribution a
/// draw uses, zeros for removed tokens. Greedy parameters give a one-hot at the argmax; a row
/// with no finite value gives all zeros.
pub fn filtered_probs(row: &[f32], params: &SamplingParams) -> Vec<f32> {
    let vocab = row.len();
    if params.is_greedy() {
        let mut probs = vec![0.0; vocab];
        if let Some(i) = argmax(row) {
            probs[i] = 1.0;
        }
        return probs;
    }
    with_scratch(vocab, |s| match filters::build(row, 1.0, params, s) {
        Some(dist) => filters::dense_probs(&dist, s, vocab),
        None => vec![0.0; vocab],
    })
}
