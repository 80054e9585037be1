//! Plain reference implementations: dense loops, full sorts, `f64`, each rule written the most
//! obvious way, for the optimised sampler to be checked against.

use std::collections::{BTreeSet, HashMap};

use crate::params::SamplingParams;
use crate::sampling::SampleRequest;

/// Steps 1-8 on a copy of `raw`, one dense loop per rule.
pub fn process(raw: &[f32], req: &SampleRequest<'_>) -> Vec<f32> {
    let p = req.params;
    let vocab = raw.len();
    let mut x: Vec<f32> = raw
        .iter()
        .map(|&v| if v.is_nan() { f32::NEG_INFINITY } else { v })
        .collect();
    for &(id, b) in &p.logit_bias {
        if (id as usize) < vocab {
            x[id as usize] += b;
        }
    }
    if let Some(bias) = &p.embedding_bias {
        for i in 0..vocab {
            x[i] += bias[i];
        }
    }
    if let Some(allowed) = &p.allowed_token_ids {
        for (i, v) in x.iter_mut().enumerate() {
            if !allowed.contains(&(i as u32)) {
                *v = f32::NEG_INFINITY;
            }
        }
    }
    for id in banned(req) {
        if (id as usize) < vocab {
            x[id as usize] = f32::NEG_INFINITY;
        }
    }
    let seen: BTreeSet<u32> = req.prompt.iter().chain(req.output).copied().collect();
    for id in seen.into_iter().filter(|&id| (id as usize) < vocab) {
        let v = &mut x[id as usize];
        if p.repetition_penalty != 1.0 {
            *v = if *v > 0.0 {
                *v / p.repetition_penalty
            } else {
                *v * p.repetition_penalty
            };
        }
        let count = req.output.iter().filter(|&&t| t == id).count();
        if count > 0 && (p.frequency_penalty != 0.0 || p.presence_penalty != 0.0) {
            *v -= p.frequency_penalty * count as f32 + p.presence_penalty;
        }
    }
    if p.temperature > 0.0 && p.temperature != 1.0 {
        x.iter_mut().for_each(|v| *v /= p.temperature);
    }
    x
}

/// Steps 3-5: bad words, min_tokens, no-repeat n-grams.
fn banned(req: &SampleRequest<'_>) -> BTreeSet<u32> {
    let p = req.params;
    let mut banned = BTreeSet::new();
    for word in &p.bad_words {
        if let Some((last, prefix)) = word.split_last() {
            let n = req.output.len();
            if prefix.len() <= n && req.output[n - prefix.len()..] == *prefix {
                banned.insert(*last);
            }
        }
    }
    if req.output.len() < p.min_tokens as usize {
        banned.extend(req.eos_token_ids.iter().chain(&p.stop_token_ids).copied());
    }
    banned.extend(hf_no_repeat_ngram(p.no_repeat_ngram_size as usize, req));
    banned
}

/// HF `_get_ngrams` + `_calc_banned_ngram_tokens` over prompt ++ output.
fn hf_no_repeat_ngram(n: usize, req: &SampleRequest<'_>) -> Vec<u32> {
    let seq: Vec<u32> = req.prompt.iter().chain(req.output).copied().collect();
    if n == 0 || seq.len() + 1 < n {
        return Vec::new();
    }
    let mut grams: HashMap<Vec<u32>, Vec<u32>> = HashMap::new();
    for w in seq.windows(n) {
        grams.entry(w[..n - 1].to_vec()).or_default().push(w[n - 1]);
    }
    let start = seq.len() + 1 - n;
    grams.get(&seq[start..]).cloned().unwrap_or_default()
}

/// Ids of `probs` with a nonzero probability, by descending probability then id.
pub fn ranked(probs: &[f64]) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..probs.len()).filter(|&i| probs[i] > 0.0).collect();
    ids.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    ids
}

fn normalise(probs: &mut [f64]) {
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|q| *q /= total);
}

/// Steps 9-12 in `f64` with full sorts; the returned probabilities sum to 1.
pub fn filtered(x: &[f32], p: &SamplingParams) -> Vec<f64> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut probs: Vec<f64> = x
        .iter()
        .map(|&v| {
            if v.is_nan() {
                0.0
            } else {
                f64::from(v - m).exp()
            }
        })
        .collect();
    normalise(&mut probs);
    let by_logit = {
        let mut ids: Vec<usize> = (0..x.len()).filter(|&i| probs[i] > 0.0).collect();
        ids.sort_by(|&a, &b| x[b].total_cmp(&x[a]).then(a.cmp(&b)));
        ids
    };
    if p.top_k > 0 && (p.top_k as usize) < x.len() {
        for &i in &by_logit[(p.top_k as usize).min(by_logit.len())..] {
            probs[i] = 0.0;
        }
        normalise(&mut probs);
    }
    if p.top_p < 1.0 {
        let mut before = 0.0;
        for i in ranked(&probs) {
            if before >= f64::from(p.top_p) {
                probs[i] = 0.0;
            }
            before += probs[i];
        }
        normalise(&mut probs);
    }
    if p.min_p > 0.0 {
        let top = probs.iter().copied().fold(0.0, f64::max);
        probs
            .iter_mut()
            .filter(|q| **q < f64::from(p.min_p) * top)
            .for_each(|q| *q = 0.0);
        normalise(&mut probs);
    }
    if p.typical_p < 1.0 {
        hf_typical(&mut probs, f64::from(p.typical_p));
        normalise(&mut probs);
    }
    probs
}

fn hf_typical(probs: &mut [f64], mass: f64) {
    let live: Vec<usize> = (0..probs.len()).filter(|&i| probs[i] > 0.0).collect();
    let entropy: f64 = live.iter().map(|&i| -probs[i] * probs[i].ln()).sum();
    let score = |i: usize| (-probs[i].ln() - entropy).abs();
    let mut order = live.clone();
    order.sort_by(|&a, &b| score(a).total_cmp(&score(b)).then(a.cmp(&b)));
    let mut cum = 0.0;
    let last = order
        .iter()
        .position(|&i| {
            cum += probs[i];
            cum >= mass
        })
        .unwrap_or(order.len() - 1);
    let bound = score(order[last]);
    let removed: Vec<usize> = live.into_iter().filter(|&i| score(i) > bound).collect();
    for i in removed {
        probs[i] = 0.0;
    }
}

/// Inverse CDF over `probs` in rank order (`ids`, from [`ranked`]) at `u`.
pub fn inverse_cdf(probs: &[f64], ids: &[usize], u: f64) -> usize {
    let mut cum = 0.0;
    for &i in ids {
        cum += probs[i];
        if cum > u {
            return i;
        }
    }
    *ids.last().unwrap()
}

/// `log_softmax` of `x` in `f64` (NaN as `-inf`).
pub fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f64 = x
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| f64::from(v - m).exp())
        .sum();
    x.iter()
        .map(|&v| {
            if v.is_nan() {
                f64::NEG_INFINITY
            } else {
                f64::from(v - m) - z.ln()
            }
        })
        .collect()
}
