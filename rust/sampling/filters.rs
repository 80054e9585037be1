//! Steps 9-12 and the draw: top-k, top-p, min-p and typical-p, each on the distribution the one
//! before it left (renormalised), then inverse-CDF over the kept tokens in rank order.
//!
//! Weights are `exp(x - max)` of the processed logits, so the most probable token weighs
//! exactly one. The first active filter narrows the row to an explicit candidate list without sorting the
//! vocabulary: top-k by a block scan, top-p by the dense weights and a head that is widened only
//! when its mass falls short, min-p by a logit threshold. Later filters work on that list. With
//! no filter the distribution stays dense and a draw ranks only the head it needs.

use super::kernels::{exp_neg, exp_shifted, row_max, with_scale, Scale, Unit};
use super::scratch::Scratch;
use super::select::{at_or_before, collect_at_least, last_ranked, locate, top_by_value, Cand};
use crate::params::SamplingParams;

/// Weights at or above this form the head a dense draw or top-p ranks first.
const HEAD_WEIGHT: f32 = 1.0 / 1024.0;
/// The smallest positive `f32`: collecting at it keeps every token with a nonzero weight.
const ANY_WEIGHT: f32 = f32::from_bits(1);

/// Where the kept tokens of a filtered distribution are.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Kept {
    /// In `Scratch::cands`, with their weights.
    List,
    /// Every token, with its weight in `Scratch::e` (no filter narrowed the row).
    Dense,
}

/// A filtered distribution: `P(token) = weight / total`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dist {
    pub kept: Kept,
    pub total: f64,
}

/// True when top-k narrows a row of `vocab` tokens.
pub(crate) fn top_k_active(p: &SamplingParams, vocab: usize) -> bool {
    p.top_k > 0 && (p.top_k as usize) < vocab
}

/// Builds the filtered distribution of the processed row `x / t` (`t` = 1 for a row already
/// divided) under `p`'s top-k, top-p, min-p and typical-p; `None` when no value is above `-inf`.
pub(crate) fn build(x: &[f32], t: f32, p: &SamplingParams, s: &mut Scratch) -> Option<Dist> {
    with_scale!(t, |sc| {
        if top_k_active(p, x.len()) {
            top_by_value(x, sc, p.top_k as usize, &mut s.cands);
            after_top_k(p, s)
        } else {
            build_dense(x, sc, p, s)
        }
    })
}

/// The rest of [`build`] once top-k has left its candidates in `s.cands` as scaled logits in
/// rank order (so the first is the row's maximum).
pub(crate) fn after_top_k(p: &SamplingParams, s: &mut Scratch) -> Option<Dist> {
    let m = s.cands.first()?.w;
    s.cands.iter_mut().for_each(|c| c.w = weight(c.w, m));
    Some(finish(p, false, s))
}

fn build_dense<S: Scale>(x: &[f32], sc: S, p: &SamplingParams, s: &mut Scratch) -> Option<Dist> {
    s.cands.clear();
    let m = sc.apply(row_max(x));
    if m == f32::NEG_INFINITY {
        return None;
    }
    let top_p_done = m != f32::INFINITY && p.top_p < 1.0;
    if m == f32::INFINITY {
        collect_at_least(x, sc, f32::INFINITY, &mut s.cands);
        s.cands.iter_mut().for_each(|c| c.w = 1.0);
    } else if top_p_done {
        let z = exp_shifted(x, sc, m, &mut s.e);
        nucleus_of_dense(p.top_p, z, s);
    } else if p.min_p > 0.0 {
        // A superset by the logit threshold, then the exact rule on the weights in `finish`.
        collect_at_least(x, sc, m + p.min_p.ln() - 1e-3, &mut s.cands);
        s.cands.iter_mut().for_each(|c| c.w = exp_neg(c.w - m));
    } else if p.typical_p < 1.0 {
        exp_shifted(x, sc, m, &mut s.e);
        collect_at_least(&s.e, Unit, ANY_WEIGHT, &mut s.cands);
    } else {
        let total = exp_shifted(x, sc, m, &mut s.e);
        return Some(Dist {
            kept: Kept::Dense,
            total,
        });
    }
    Some(finish(p, top_p_done, s))
}

/// The filters after the first one, on the candidate list.
fn finish(p: &SamplingParams, top_p_done: bool, s: &mut Scratch) -> Dist {
    s.cands.retain(|c| c.w > 0.0);
    if p.top_p < 1.0 && !top_p_done {
        let total = sum(&s.cands);
        keep_nucleus(&mut s.cands, p.top_p, total, &mut s.hist);
    }
    if p.min_p > 0.0 {
        // Renormalising does not change ratios, so the kept set's top weight is the reference;
        // the top token itself always stays.
        let top = s.cands.iter().fold(0.0f32, |a, c| a.max(c.w));
        let floor = (p.min_p * top).min(top);
        s.cands.retain(|c| c.w >= floor);
    }
    if p.typical_p < 1.0 {
        keep_typical(&mut s.cands, p.typical_p);
    }
    Dist {
        kept: Kept::List,
        total: sum(&s.cands),
    }
}

/// `exp(v - m)`, where a `+inf` maximum gives the `+inf` tokens weight 1 and the rest 0.
fn weight(v: f32, m: f32) -> f32 {
    if m == f32::INFINITY {
        f32::from(u8::from(v == f32::INFINITY))
    } else {
        exp_neg(v - m)
    }
}

fn sum(list: &[Cand]) -> f64 {
    list.iter().map(|c| f64::from(c.w)).sum()
}

/// Top-p: the smallest rank-order prefix whose mass reaches `top_p * total` (at least one).
fn keep_nucleus(list: &mut Vec<Cand>, top_p: f32, total: f64, hist: &mut [f64]) {
    let target = f64::from(top_p) * total;
    let cut = locate(list, target, false, hist).or_else(|| last_ranked(list));
    if let Some(cut) = cut {
        list.retain(|c| at_or_before(c, &cut));
    }
}

/// Top-p straight from the dense weights: rank the head first and widen to every nonzero
/// weight only when the head's mass falls short of the nucleus.
fn nucleus_of_dense(top_p: f32, z: f64, s: &mut Scratch) {
    let target = f64::from(top_p) * z;
    collect_at_least(&s.e, Unit, HEAD_WEIGHT, &mut s.cands);
    let cut = match locate(&mut s.cands, target, false, &mut s.hist) {
        Some(cut) => Some(cut),
        None => {
            s.cands.clear();
            collect_at_least(&s.e, Unit, ANY_WEIGHT, &mut s.cands);
            locate(&mut s.cands, target, false, &mut s.hist).or_else(|| last_ranked(&s.cands))
        }
    };
    if let Some(cut) = cut {
        s.cands.retain(|c| at_or_before(c, &cut));
    }
}

/// Typical-p (HF `TypicalLogitsWarper`): rank tokens by `|-log p - H|` (ties by id), take the
/// shortest prefix whose mass reaches `typical_p`, and keep every token scored no worse than
/// its last entry.
fn keep_typical(list: &mut Vec<Cand>, typical_p: f32) {
    let total = sum(list);
    let ln_total = total.ln();
    let entropy: f64 = list
        .iter()
        .map(|c| {
            let lp = f64::from(c.w).ln() - ln_total;
            -lp * lp.exp()
        })
        .sum();
    let mut scored: Vec<(f64, Cand)> = list
        .iter()
        .map(|c| ((-(f64::from(c.w).ln() - ln_total) - entropy).abs(), *c))
        .collect();
    scored.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.id.cmp(&b.1.id)));
    let mut mass = 0.0f64;
    let mut last = scored.len().saturating_sub(1);
    for (i, (_, c)) in scored.iter().enumerate() {
        mass += f64::from(c.w) / total;
        if mass >= f64::from(typical_p) {
            last = i;
            break;
        }
    }
    let Some(&(bound, _)) = scored.get(last) else {
        return;
    };
    list.clear();
    list.extend(
        scored
            .iter()
            .filter(|(score, _)| *score <= bound)
            .map(|(_, c)| *c),
    );
}

/// The token whose rank-order cumulative probability first exceeds `u` (in [0, 1)).
pub(crate) fn draw(dist: &Dist, u: f64, s: &mut Scratch) -> Cand {
    let target = u * dist.total;
    match dist.kept {
        Kept::List => locate(&mut s.cands, target, true, &mut s.hist)
            .or_else(|| last_ranked(&s.cands))
            .expect("a built distribution keeps at least one token"),
        Kept::Dense => {
            s.head.clear();
            collect_at_least(&s.e, Unit, HEAD_WEIGHT, &mut s.head);
            if let Some(c) = locate(&mut s.head, target, true, &mut s.hist) {
                return c;
            }
            s.head.clear();
            collect_at_least(&s.e, Unit, ANY_WEIGHT, &mut s.head);
            locate(&mut s.head, target, true, &mut s.hist)
                .or_else(|| last_ranked(&s.head))
                .expect("a built distribution keeps at least one token")
        }
    }
}

/// The probability of every token under `dist` (zeros for removed tokens).
pub(crate) fn dense_probs(dist: &Dist, s: &Scratch, vocab: usize) -> Vec<f32> {
    let inv = 1.0 / dist.total;
    match dist.kept {
        Kept::Dense => s.e[..vocab]
            .iter()
            .map(|&w| (f64::from(w) * inv) as f32)
            .collect(),
        Kept::List => {
            let mut probs = vec![0.0f32; vocab];
            for c in &s.cands {
                probs[c.id as usize] = (f64::from(c.w) * inv) as f32;
            }
            probs
        }
    }
}
