//! Verifying a draft that came with the drafter's logits (`draft_logits`): the
//! speculative-sampling rule of Leviathan et al. and Chen et al. Draft token `d` at a position
//! where the target's distribution is `p` (after every processor and filter, exactly what a
//! draw would use) and the drafter's is `q` (the softmax of its logits row) is accepted with
//! probability `min(1, p(d) / q(d))`; on rejection the token is drawn from the normalised
//! residual `max(0, p - q)`, and the run stops. When every draft token is accepted, one bonus
//! token is drawn from the next position as usual. The accepted-or-resampled token is then
//! distributed as `p`, whatever `q` is, provided `d` was drawn from `q`.
//!
//! The acceptance test and the residual draw use their own counter-based streams (the seed
//! mixed with a stream constant), keyed by sample index and position like every draw, so a
//! seeded request replays. A greedy position (temperature 0, top-k 1) accepts exactly the
//! target's argmax.

use super::filters::{dense_probs, Dist};
use super::processors::check_params;
use super::rng::uniform;
use super::run::{choose, no_finite, no_logprobs, sample_group, with_logprobs, Choice};
use super::scratch::{with_scratch, Scratch};
use super::select::Cand;
use super::{SampleRequest, Sampled, SamplerConfig};
use crate::error::{CoreError, CoreResult};
use crate::types::TokenId;

/// Mixed into the seed for the acceptance uniforms.
const ACCEPT_STREAM: u64 = 0x9E37_79B9_7F4A_7C15;
/// Mixed into the seed for the residual draws.
const RESIDUAL_STREAM: u64 = 0xC2B2_AE3D_27D4_EB4F;

/// One row's draft with the drafter's logits, to verify against the target's logits.
#[derive(Clone, Debug)]
pub struct DraftCheck<'a> {
    /// One request per position, `draft.len() + 1` of them: `reqs[i]` (history: the output
    /// plus draft tokens `0..i`) judges draft token `i`; the last draws the bonus token.
    pub reqs: Vec<SampleRequest<'a>>,
    /// The draft tokens.
    pub draft: &'a [TokenId],
    /// Row-major `[draft.len(), vocab]`: the drafter's logits at each draft token.
    pub draft_logits: &'a [f32],
}

/// The tokens a draft with logits yields: the accepted draft tokens, then the target's token
/// (a residual draw after a rejection, the bonus draw after none): between 1 and
/// `draft.len() + 1`. Errors (for this row alone) on `draft_logits` of the wrong shape,
/// parameters that do not fit `vocab`, or a position with no finite logit left.
pub fn verify_draft(
    logits: &[f32],
    vocab: usize,
    check: &DraftCheck<'_>,
    cfg: &SamplerConfig,
) -> CoreResult<Vec<Sampled>> {
    let k = check.draft.len();
    if check.reqs.len() != k + 1 || check.draft_logits.len() != k * vocab {
        return Err(CoreError::invalid(
            "draft_logits",
            "wrong_shape",
            format!(
                "`draft_logits` must be [num_draft_tokens ({k}), vocab ({vocab})]; got {} values",
                check.draft_logits.len()
            ),
        ));
    }
    check_params(check.reqs[0].params, vocab)?;
    with_scratch(vocab, |s| {
        let mut out = Vec::with_capacity(k + 1);
        for (i, &d) in check.draft.iter().enumerate() {
            let req = &check.reqs[i];
            let raw = &logits[req.row * vocab..][..vocab];
            let q = softmax(&check.draft_logits[i * vocab..][..vocab]);
            let (sampled, accepted) = judge(raw, req, d, &q, cfg, s)?;
            out.push(sampled);
            if !accepted {
                return Ok(out);
            }
        }
        let last = &check.reqs[k];
        let raw = &logits[last.row * vocab..][..vocab];
        out.extend(sample_group(
            raw,
            std::slice::from_ref(last),
            last.row,
            cfg,
            s,
        )?);
        Ok(out)
    })
}

/// Judges draft token `d` at `req`'s position: the token kept there and whether it is `d`.
fn judge(
    raw: &[f32],
    req: &SampleRequest<'_>,
    d: TokenId,
    q: &[f64],
    cfg: &SamplerConfig,
    s: &mut Scratch,
) -> CoreResult<(Sampled, bool)> {
    let dist = match choose(raw, req, cfg, s).ok_or_else(|| no_finite(req.row, req.row))? {
        Choice::Greedy(id) => {
            let c = Cand { w: 1.0, id };
            return Ok((scored(raw, c, None, req, cfg, s), id == d));
        }
        Choice::Sample(dist) => dist,
    };
    let p = dense_probs(&dist, s, raw.len());
    let pos = req.output.len() as u64;
    let pd = p.get(d as usize).map_or(0.0, |&x| f64::from(x));
    let qd = q.get(d as usize).copied().unwrap_or(0.0);
    let u = uniform(req.seed ^ ACCEPT_STREAM, req.sample_index, pos);
    let accepted = pd > 0.0 && u * qd < pd;
    let token = if accepted {
        d
    } else {
        let u = uniform(req.seed ^ RESIDUAL_STREAM, req.sample_index, pos);
        residual_draw(&p, q, u)
    };
    let w = (f64::from(p[token as usize]) * dist.total) as f32;
    let c = Cand { w, id: token };
    Ok((scored(raw, c, Some(&dist), req, cfg, s), accepted))
}

/// The token at `u` (in [0, 1)) of the normalised `max(0, p - q)` by inverse CDF in id order;
/// of `p` itself when the residual is empty (`p <= q` everywhere, which a rejection rules out
/// up to rounding).
fn residual_draw(p: &[f32], q: &[f64], u: f64) -> TokenId {
    let residual = |j: usize| (f64::from(p[j]) - q[j]).max(0.0);
    let total: f64 = (0..p.len()).map(residual).sum();
    let weight: &dyn Fn(usize) -> f64 = match total > 0.0 {
        true => &residual,
        false => &|j| f64::from(p[j]),
    };
    let total = if total > 0.0 {
        total
    } else {
        p.iter().map(|&x| f64::from(x)).sum()
    };
    let target = u * total;
    let mut cum = 0.0;
    let mut last = 0;
    for j in 0..p.len() {
        let w = weight(j);
        if w > 0.0 {
            cum += w;
            last = j;
            if cum > target {
                return j as TokenId;
            }
        }
    }
    last as TokenId
}

/// The softmax of a logits row in f64 (NaN counts as `-inf`; all zeros when nothing is finite).
fn softmax(row: &[f32]) -> Vec<f64> {
    let m = row
        .iter()
        .filter(|x| !x.is_nan())
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    if !m.is_finite() {
        return vec![0.0; row.len()];
    }
    let e: Vec<f64> = row
        .iter()
        .map(|&x| match x.is_nan() {
            true => 0.0,
            false => f64::from(x - m).exp(),
        })
        .collect();
    let total: f64 = e.iter().sum();
    e.into_iter().map(|x| x / total).collect()
}

/// `c` with the logprobs its request asks for.
fn scored(
    raw: &[f32],
    c: Cand,
    dist: Option<&Dist>,
    req: &SampleRequest<'_>,
    cfg: &SamplerConfig,
    s: &mut Scratch,
) -> Sampled {
    let k = match req.params.logprobs {
        Some(k) => k as usize,
        None if req.params.needs_token_logprob() => 0,
        None => return no_logprobs(c.id),
    };
    let mode = cfg.logprobs_mode;
    with_logprobs(raw, &[c], dist, k, mode, s)
        .pop()
        .expect("one token in, one out")
}
