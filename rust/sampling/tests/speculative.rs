//! `verify_draft`: the speculative-sampling rule keeps the target's distribution whatever the
//! drafter's, replays under a seed, and takes the greedy argmax exactly.

use super::{random_row, req};
use crate::params::SamplingParams;
use crate::sampling::{
    filtered_probs, process_logits, uniform, verify_draft, DraftCheck, SamplerConfig,
};

const VOCAB: usize = 8;

/// The target's exact distribution at a row (processors, temperature and filters applied).
fn target_probs(raw: &[f32], p: &SamplingParams, prompt: &[u32], output: &[u32]) -> Vec<f32> {
    let mut row = raw.to_vec();
    process_logits(&mut row, &req(p, prompt, output), VOCAB).unwrap();
    filtered_probs(&row, p)
}

fn softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = row.iter().map(|&x| f64::from(x - m).exp()).collect();
    let total: f64 = e.iter().sum();
    e.into_iter().map(|x| x / total).collect()
}

/// Draws from `q` at `u` by inverse CDF in id order.
fn draw(q: &[f64], u: f64) -> u32 {
    let mut cum = 0.0;
    for (j, &x) in q.iter().enumerate() {
        cum += x;
        if u < cum {
            return j as u32;
        }
    }
    (q.len() - 1) as u32
}

/// Pearson's chi-square of `counts` against `probs` over the tokens `probs` allows.
fn chi_square(counts: &[u64], probs: &[f32], n: u64) -> (f64, usize) {
    let mut chi = 0.0;
    let mut df = 0;
    for (&c, &p) in counts.iter().zip(probs) {
        if p > 0.0 {
            let e = f64::from(p) * n as f64;
            chi += (c as f64 - e).powi(2) / e;
            df += 1;
        } else {
            assert_eq!(c, 0, "a token the target rules out was emitted");
        }
    }
    (chi, df - 1)
}

#[test]
fn the_first_token_is_distributed_as_the_target_whatever_the_draft() {
    let prompt = [1, 2, 3];
    let output = [4];
    let p = SamplingParams {
        temperature: 0.8,
        top_k: 6,
        repetition_penalty: 1.2,
        ..SamplingParams::default()
    };
    let target_raw = random_row(VOCAB, 11, 4.0);
    let logits: Vec<f32> = [target_raw.clone(), random_row(VOCAB, 12, 4.0)].concat();
    let want = target_probs(&target_raw, &p, &prompt, &output);
    // Two drafters: one close to the target, one far from it.
    for draft_seed in [13, 14] {
        let draft_logits = random_row(VOCAB, draft_seed, 6.0);
        let q = softmax(&draft_logits);
        let n = 40_000u64;
        let mut counts = [0u64; VOCAB];
        let mut accepted = 0;
        for seed in 0..n {
            let d = draw(&q, uniform(seed, 7, 99));
            let history = [output[0], d];
            let first = crate::sampling::SampleRequest {
                seed,
                ..req(&p, &prompt, &output)
            };
            let check = DraftCheck {
                reqs: vec![
                    first,
                    crate::sampling::SampleRequest {
                        row: 1,
                        output: &history,
                        ..first
                    },
                ],
                draft: &[d],
                draft_logits: &draft_logits,
            };
            let out = verify_draft(&logits, VOCAB, &check, &SamplerConfig::default()).unwrap();
            counts[out[0].token as usize] += 1;
            if out.len() == 2 {
                assert_eq!(out[0].token, d);
                accepted += 1;
            }
        }
        // With the seeds fixed this is deterministic; 0.999 quantile of chi-square with <= 7
        // degrees of freedom is 24.3.
        let (chi, df) = chi_square(&counts, &want, n);
        assert!(
            chi < 24.3,
            "draft {draft_seed}: chi^2 {chi} with {df} dof: {counts:?} vs {want:?}"
        );
        // The acceptance rate is sum_x min(p(x), q(x)).
        let overlap: f64 = want
            .iter()
            .zip(&q)
            .map(|(&a, &b)| f64::from(a).min(b))
            .sum();
        let rate = accepted as f64 / n as f64;
        assert!((rate - overlap).abs() < 0.01, "rate {rate} vs {overlap}");
    }
}

#[test]
fn a_greedy_row_accepts_exactly_the_argmax_and_a_seed_replays() {
    let prompt = [1, 2];
    let logits: Vec<f32> = [random_row(VOCAB, 3, 4.0), random_row(VOCAB, 4, 4.0)].concat();
    let argmax = (0..VOCAB)
        .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
        .unwrap() as u32;
    let draft_logits = vec![0.0; VOCAB];
    let greedy = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    for d in 0..VOCAB as u32 {
        let history = [d];
        let first = req(&greedy, &prompt, &[]);
        let check = DraftCheck {
            reqs: vec![
                first,
                crate::sampling::SampleRequest {
                    row: 1,
                    output: &history,
                    ..first
                },
            ],
            draft: &[d],
            draft_logits: &draft_logits,
        };
        let out = verify_draft(&logits, VOCAB, &check, &SamplerConfig::default()).unwrap();
        assert_eq!(out[0].token, argmax);
        assert_eq!(out.len(), if d == argmax { 2 } else { 1 });
    }
    // Sampled: the same seed gives the same tokens; a wrong shape is an error naming the field.
    let p = SamplingParams::default();
    let first = crate::sampling::SampleRequest {
        seed: 5,
        ..req(&p, &prompt, &[])
    };
    let history = [2];
    let check = DraftCheck {
        reqs: vec![
            first,
            crate::sampling::SampleRequest {
                row: 1,
                output: &history,
                ..first
            },
        ],
        draft: &[2],
        draft_logits: &draft_logits,
    };
    let cfg = SamplerConfig::default();
    let a = verify_draft(&logits, VOCAB, &check, &cfg).unwrap();
    assert_eq!(a, verify_draft(&logits, VOCAB, &check, &cfg).unwrap());
    let bad = DraftCheck {
        draft_logits: &draft_logits[1..],
        ..check
    };
    let err = verify_draft(&logits, VOCAB, &bad, &cfg).unwrap_err();
    assert!(err.to_string().contains("draft_logits"), "{err}");
}
