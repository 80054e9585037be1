//! Logprobs of a draw: the chosen token's and the top `k` alternatives (descending logprob, ties
//! by id), from the raw row's log-softmax ([`LogprobsMode::Raw`], vLLM v1's default) or from the
//! distribution actually sampled from ([`LogprobsMode::Processed`]).
//!
//! [`LogprobsMode::Raw`]: super::LogprobsMode::Raw
//! [`LogprobsMode::Processed`]: super::LogprobsMode::Processed

use super::filters::{Dist, Kept};
use super::kernels::{row_max, sum_exp_shifted, Unit};
use super::scratch::Scratch;
use super::select::{rank, top_by_value, Cand};
use crate::types::TokenId;

/// The log-softmax of a whole row, as its maximum and log-normaliser. NaN counts as `-inf`;
/// when the maximum is `+inf`, the `+inf` entries share all the mass.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogSoftmax {
    max: f32,
    ln_z: f64,
}

impl LogSoftmax {
    /// Measures `row` (one dense pass with `exp`).
    pub fn of(row: &[f32]) -> Self {
        let max = row_max(row);
        let ln_z = if max == f32::INFINITY {
            (row.iter().filter(|&&v| v == f32::INFINITY).count() as f64).ln()
        } else if max == f32::NEG_INFINITY {
            0.0
        } else {
            sum_exp_shifted(row, max).ln()
        };
        LogSoftmax { max, ln_z }
    }

    /// The logprob of a token whose logit is `v`.
    pub fn logprob(&self, v: f32) -> f32 {
        if v.is_nan() || v == f32::NEG_INFINITY {
            return f32::NEG_INFINITY;
        }
        if self.max == f32::INFINITY {
            return if v == f32::INFINITY {
                -self.ln_z as f32
            } else {
                f32::NEG_INFINITY
            };
        }
        (f64::from(v - self.max) - self.ln_z) as f32
    }

    /// The `k` most probable tokens of `row`, padded with the lowest remaining ids at `-inf`
    /// when fewer than `k` are above `-inf`.
    pub fn top(&self, row: &[f32], k: usize, buf: &mut Vec<Cand>) -> Vec<(TokenId, f32)> {
        top_by_value(row, Unit, k, buf);
        let mut top: Vec<(TokenId, f32)> = buf.iter().map(|c| (c.id, self.logprob(c.w))).collect();
        pad_with_lowest_ids(&mut top, k, row.len());
        top
    }
}

/// The `k` highest entries of a row that already holds logprobs, padded like
/// [`LogSoftmax::top`].
pub(crate) fn top_logprobs(row: &[f32], k: usize, buf: &mut Vec<Cand>) -> Vec<(TokenId, f32)> {
    top_by_value(row, Unit, k, buf);
    let mut top: Vec<(TokenId, f32)> = buf.iter().map(|c| (c.id, c.w)).collect();
    pad_with_lowest_ids(&mut top, k, row.len());
    top
}

/// Appends `(id, -inf)` for the lowest ids not yet in `top` until it holds `min(k, vocab)`.
fn pad_with_lowest_ids(top: &mut Vec<(TokenId, f32)>, k: usize, vocab: usize) {
    let want = k.min(vocab);
    let mut id = 0usize;
    while top.len() < want && id < vocab {
        // `top` is shorter than k <= 20 here, so the membership scan is cheap.
        if !top.iter().any(|&(t, _)| t as usize == id) {
            top.push((id as TokenId, f32::NEG_INFINITY));
        }
        id += 1;
    }
}

/// The chosen token's logprob and the top `k` under the filtered distribution `dist` (removed
/// tokens are at `-inf` and rank after the kept ones, by id).
pub(crate) fn from_dist(
    dist: &Dist,
    chosen: &Cand,
    k: usize,
    s: &mut Scratch,
) -> (f32, Vec<(TokenId, f32)>) {
    let ln_total = dist.total.ln();
    let lp = |w: f32| {
        if w > 0.0 {
            (f64::from(w).ln() - ln_total) as f32
        } else {
            f32::NEG_INFINITY
        }
    };
    let mut top: Vec<(TokenId, f32)> = match dist.kept {
        // Zero weights rank after the kept tokens by id: exactly the padding rule.
        Kept::Dense => {
            top_by_value(&s.e, Unit, k, &mut s.head);
            s.head.iter().map(|c| (c.id, lp(c.w))).collect()
        }
        Kept::List => {
            s.head.clear();
            s.head.extend_from_slice(&s.cands);
            if s.head.len() > k && k > 0 {
                s.head.select_nth_unstable_by(k - 1, rank);
                s.head.truncate(k);
            }
            s.head.sort_unstable_by(rank);
            s.head.truncate(k);
            s.head.iter().map(|c| (c.id, lp(c.w))).collect()
        }
    };
    pad_with_lowest_ids(&mut top, k, s.e.len());
    (lp(chosen.w), top)
}
