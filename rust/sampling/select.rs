//! Candidate lists and the one order the sampler ranks tokens by: higher value first, then the
//! lower token id. Selections never sort the whole vocabulary: they scan the row in blocks,
//! skip a block whose maximum is below the running threshold, and sort only what survives.

use std::cmp::Ordering;

use super::kernels::{dispatch, max_of, Scale};

/// Block scanned at once; its maximum decides whether any element of it is looked at.
const SCAN_BLOCK: usize = 64;
/// Lists up to this length are ranked by sorting; longer ones through a histogram of weights.
const SORT_MAX: usize = 2048;
/// Histogram buckets: the top 16 bits of a weight in (0, 1] (sign, exponent, 7 mantissa bits).
/// Bit patterns of positive floats order like their values, so buckets order like weights.
pub(crate) const NUM_BUCKETS: usize = (0x3F80_0000 >> 16) + 1;

/// A token and its value: a logit while selecting, an unnormalised probability afterwards.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Cand {
    pub w: f32,
    pub id: u32,
}

/// The sampler's ranking: descending value, ties by ascending id (values are never NaN here).
#[inline]
pub(crate) fn rank(a: &Cand, b: &Cand) -> Ordering {
    b.w.partial_cmp(&a.w)
        .unwrap_or(Ordering::Equal)
        .then(a.id.cmp(&b.id))
}

dispatch! {
    /// Pushes every `(v, i)` with `v = s(xs[i]) >= threshold` (NaN never qualifies) onto `out`.
    fn collect_at_least<S: Scale>(xs: &[f32], s: S, threshold: f32, out: &mut Vec<Cand>) -> () =
        collect_any
}

#[inline(always)]
fn collect_any<S: Scale>(xs: &[f32], s: S, threshold: f32, out: &mut Vec<Cand>) {
    for (b, block) in xs.chunks(SCAN_BLOCK).enumerate() {
        if s.apply(max_of(block)) >= threshold {
            push_block(block, b * SCAN_BLOCK, s, AnyId, threshold, out);
        }
    }
}

/// Appends the entries of `block` (starting at id `base`) with `s(x) >= threshold`, without a
/// branch per element: every entry is written and the length advances only past the kept ones.
#[inline(always)]
fn push_block<S: Scale, A: Admit>(
    block: &[f32],
    base: usize,
    s: S,
    admit: A,
    threshold: f32,
    out: &mut Vec<Cand>,
) {
    let start = out.len();
    out.resize(start + block.len(), Cand { w: 0.0, id: 0 });
    let slots = &mut out[start..];
    let mut n = 0usize;
    for (j, &x) in block.iter().enumerate() {
        let v = s.apply(x);
        slots[n] = Cand {
            w: v,
            id: (base + j) as u32,
        };
        n += usize::from(v >= threshold && admit.admit(base + j));
    }
    out.truncate(start + n);
}

/// The `k` highest values `s(xs[i])` in rank order (fewer when fewer are above `-inf`; NaN
/// and `-inf` never qualify). `out` is cleared first.
pub(crate) fn top_by_value<S: Scale>(xs: &[f32], s: S, k: usize, out: &mut Vec<Cand>) {
    top_admitted(xs, s, k, AnyId, out);
}

dispatch! {
    /// [`top_by_value`] among the ids `admit` lets through.
    fn top_admitted<S: Scale, A: Admit>(xs: &[f32], s: S, k: usize, admit: A, out: &mut Vec<Cand>) -> () =
        top_any
}

#[inline(always)]
fn top_any<S: Scale, A: Admit>(xs: &[f32], s: S, k: usize, admit: A, out: &mut Vec<Cand>) {
    out.clear();
    if k == 0 {
        return;
    }
    // Trim to the best k whenever k more entries have arrived, raising the threshold: the
    // threshold then tracks the k-th best seen so far, so later blocks are mostly skipped, and
    // each trim's O(k) cost is paid once per k entries.
    let cap = 2 * k + SCAN_BLOCK;
    let mut threshold = f32::MIN;
    for (b, block) in xs.chunks(SCAN_BLOCK).enumerate() {
        if s.apply(max_of(block)) < threshold {
            continue;
        }
        push_block(block, b * SCAN_BLOCK, s, admit, threshold, out);
        if out.len() >= cap {
            out.select_nth_unstable_by(k - 1, rank);
            out.truncate(k);
            threshold = out[k - 1].w;
        }
    }
    if out.len() > k {
        out.select_nth_unstable_by(k - 1, rank);
        out.truncate(k);
    }
    out.sort_unstable_by(rank);
}

/// Which ids a scan may return (the others are skipped as if absent).
pub(crate) trait Admit: Copy {
    fn admit(self, id: usize) -> bool;
}

/// Every id.
#[derive(Clone, Copy)]
pub(crate) struct AnyId;

impl Admit for AnyId {
    #[inline(always)]
    fn admit(self, _: usize) -> bool {
        true
    }
}

/// True when `c` ranks at or before `cut`.
#[inline]
pub(crate) fn at_or_before(c: &Cand, cut: &Cand) -> bool {
    rank(c, cut) != Ordering::Greater
}

/// Walking `list` in rank order and summing weights, the first entry at which the running sum
/// exceeds `target` (`strict`) or reaches it (`!strict`); `None` when the whole list does not
/// get there. Short lists are sorted in place; long ones are bucketed by weight and only the
/// bucket holding the crossing is sorted. Weights must lie in (0, 1]; `hist` has
/// [`NUM_BUCKETS`] zeros and is left zeroed.
pub(crate) fn locate(
    list: &mut [Cand],
    target: f64,
    strict: bool,
    hist: &mut [f64],
) -> Option<Cand> {
    let crosses = |sum: f64| if strict { sum > target } else { sum >= target };
    if list.len() <= SORT_MAX {
        list.sort_unstable_by(rank);
        return walk(list, 0.0, crosses);
    }
    let bucket = |c: &Cand| ((c.w.to_bits() >> 16) as usize).min(NUM_BUCKETS - 1);
    for c in list.iter() {
        hist[bucket(c)] += f64::from(c.w);
    }
    let mut before = 0.0f64;
    let mut found = None;
    for key in (0..NUM_BUCKETS).rev() {
        if found.is_none() && hist[key] > 0.0 {
            if crosses(before + hist[key]) {
                found = Some(key);
            } else {
                before += hist[key];
            }
        }
        hist[key] = 0.0;
    }
    let key = found?;
    let mut inside: Vec<Cand> = list.iter().filter(|c| bucket(c) == key).copied().collect();
    inside.sort_unstable_by(rank);
    // The bucket's sum said the crossing is inside it; if rounding disagrees, its last entry is
    // the closest to what the bucket sums promised.
    walk(&inside, before, crosses).or_else(|| inside.last().copied())
}

fn walk(sorted: &[Cand], start: f64, crosses: impl Fn(f64) -> bool) -> Option<Cand> {
    let mut sum = start;
    for c in sorted {
        sum += f64::from(c.w);
        if crosses(sum) {
            return Some(*c);
        }
    }
    None
}

/// The entry ranked last in `list` (the inverse-CDF fallback when rounding leaves the target
/// just beyond the summed mass).
pub(crate) fn last_ranked(list: &[Cand]) -> Option<Cand> {
    list.iter().copied().max_by(rank)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::kernels::Unit;

    fn naive_top(xs: &[f32], k: usize) -> Vec<Cand> {
        let mut all: Vec<Cand> = xs
            .iter()
            .enumerate()
            .filter(|(_, v)| **v > f32::NEG_INFINITY)
            .map(|(i, &w)| Cand { w, id: i as u32 })
            .collect();
        all.sort_by(rank);
        all.truncate(k);
        all
    }

    #[test]
    fn top_by_value_matches_a_full_sort_with_ties_and_bans() {
        let mut xs: Vec<f32> = (0..5000u32).map(|i| ((i * 7919) % 613) as f32).collect();
        xs[17] = f32::NEG_INFINITY;
        xs[4000] = f32::NAN;
        let mut out = Vec::new();
        for k in [1, 2, 50, 700, 4999, 6000] {
            top_by_value(&xs, Unit, k, &mut out);
            let mut clean = xs.clone();
            clean[4000] = f32::NEG_INFINITY;
            assert_eq!(out, naive_top(&clean, k), "k={k}");
        }
        #[derive(Clone, Copy)]
        struct Odd;
        impl Admit for Odd {
            fn admit(self, id: usize) -> bool {
                id % 2 == 1
            }
        }
        let mut odd = xs.clone();
        odd.iter_mut()
            .step_by(2)
            .for_each(|v| *v = f32::NEG_INFINITY);
        odd[4000] = f32::NEG_INFINITY;
        top_admitted(&xs, Unit, 60, Odd, &mut out);
        assert_eq!(out, naive_top(&odd, 60));
    }

    #[test]
    fn locate_agrees_between_the_sort_and_the_histogram_paths() {
        let ws: Vec<f32> = (0..6000u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) >> 8) % 1000 + 1) as f32 / 1000.0)
            .collect();
        let list: Vec<Cand> = ws
            .iter()
            .enumerate()
            .map(|(i, &w)| Cand { w, id: i as u32 })
            .collect();
        let total: f64 = ws.iter().map(|&w| f64::from(w)).sum();
        let mut hist = vec![0.0; NUM_BUCKETS];
        let mut sorted = list.clone();
        sorted.sort_by(rank);
        for frac in [0.0, 0.1, 0.5, 0.77, 0.999] {
            let target = frac * total;
            let mut sum = 0.0;
            let expect = sorted
                .iter()
                .find(|c| {
                    sum += f64::from(c.w);
                    sum > target
                })
                .copied();
            let got = locate(&mut list.clone(), target, true, &mut hist);
            assert_eq!(got, expect, "frac={frac}");
            assert!(hist.iter().all(|&h| h == 0.0));
        }
        assert_eq!(
            locate(&mut list.clone(), 2.0 * total, true, &mut hist),
            None
        );
        assert_eq!(last_ranked(&list), sorted.last().copied());
    }
}
