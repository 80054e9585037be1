//! Each processor (steps 1-8) and each filter (steps 9-12) against `naive`.

use std::sync::Arc;

use super::naive;
use super::{random_ids, random_row, req};
use crate::error::CoreError;
use crate::params::SamplingParams;
use crate::sampling::{filtered_probs, process_logits, SampleRequest};

const VOCAB: usize = 64;

fn processed(raw: &[f32], r: &SampleRequest<'_>) -> Vec<f32> {
    let mut row = raw.to_vec();
    process_logits(&mut row, r, raw.len()).unwrap();
    row
}

/// Default parameters with one change.
fn with(change: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
    let mut p = SamplingParams::default();
    change(&mut p);
    p
}

/// Each processor alone (ids beyond the vocabulary included), then all of them together.
fn processor_cases(output: &[u32]) -> Vec<SamplingParams> {
    let mut dense = random_row(VOCAB, 3, 1.0);
    dense[5] = f32::NEG_INFINITY;
    let (last, second) = (output[output.len() - 1], output[output.len() - 2]);
    vec![
        with(|p| p.logit_bias = vec![(0, 2.5), (7, -1.0), (63, 0.25), (900, 1.0)]),
        with(|p| p.embedding_bias = Some(Arc::from(dense))),
        with(|p| p.allowed_token_ids = Some(vec![1, 9, 33, 5000])),
        with(|p| {
            p.bad_words = vec![
                vec![3],
                vec![],
                vec![last, 11],
                vec![second, last, 12],
                vec![99, 13],
            ]
        }),
        with(|p| (p.min_tokens, p.stop_token_ids) = (26, vec![4, 8])),
        with(|p| (p.min_tokens, p.stop_token_ids) = (25, vec![4, 8])),
        with(|p| p.no_repeat_ngram_size = 1),
        with(|p| p.no_repeat_ngram_size = 2),
        with(|p| p.no_repeat_ngram_size = 3),
        with(|p| p.repetition_penalty = 1.3),
        with(|p| p.repetition_penalty = 0.7),
        with(|p| p.presence_penalty = 0.5),
        with(|p| p.frequency_penalty = -0.75),
        with(|p| p.temperature = 0.6),
        with(|p| {
            p.logit_bias = vec![(2, 1.0)];
            p.allowed_token_ids = Some((0..40).collect());
            p.bad_words = vec![vec![6]];
            (p.min_tokens, p.stop_token_ids) = (100, vec![9]);
            p.no_repeat_ngram_size = 2;
            p.repetition_penalty = 1.2;
            (p.presence_penalty, p.frequency_penalty) = (0.3, 0.2);
            p.temperature = 1.7;
        }),
    ]
}

/// Exact equality: both apply the same float operations in the same order.
#[test]
fn processors_match_the_naive_rules_exactly() {
    let prompt = random_ids(40, VOCAB, 1);
    let output = random_ids(25, VOCAB, 2);
    let cases = processor_cases(&output);
    for (seed, p) in cases.iter().enumerate() {
        let mut raw = random_row(VOCAB, 100 + seed as u64, 8.0);
        raw[17] = f32::NAN;
        let mut r = req(p, &prompt, &output);
        r.eos_token_ids = &[0, 2];
        let got = processed(&raw, &r);
        let want = naive::process(&raw, &r);
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g == w || (g.is_nan() && w.is_nan()),
                "case {seed} token {i}: {g} != {w}"
            );
        }
    }
}

#[test]
fn ngram_ban_sees_the_prompt_like_hf() {
    // "1 2" occurs in the prompt; the output ends with 1, so 2 is banned.
    let (prompt, output) = ([1u32, 2, 3], [1u32]);
    let p = SamplingParams {
        no_repeat_ngram_size: 2,
        ..SamplingParams::default()
    };
    let row = processed(&[0.0; 8], &req(&p, &prompt, &output));
    let banned: Vec<usize> = (0..8).filter(|&i| row[i] == f32::NEG_INFINITY).collect();
    assert_eq!(banned, [2]);
}

#[test]
fn process_logits_rejects_mismatched_shapes() {
    let p = SamplingParams {
        embedding_bias: Some(Arc::from(vec![0.0f32; 3])),
        ..SamplingParams::default()
    };
    let mut row = vec![0.0; 4];
    let err = process_logits(&mut row, &req(&p, &[], &[]), 4).unwrap_err();
    assert!(
        matches!(err, CoreError::Invalid { ref param, .. } if param == "embedding_bias"),
        "{err}"
    );
    let d = SamplingParams::default();
    assert!(process_logits(&mut row, &req(&d, &[], &[]), 5).is_err());
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(g) - w).abs() <= 2e-6 + 2e-5 * w,
            "{what}: token {i}: got {g}, want {w}"
        );
        assert_eq!(
            g == 0.0,
            w == 0.0,
            "{what}: token {i} kept differently ({g} vs {w})"
        );
    }
}

fn filter_cases() -> Vec<SamplingParams> {
    let base = SamplingParams::default();
    let mut cases = vec![base.clone()];
    for k in [1, 2, 5, 63] {
        cases.push(SamplingParams {
            top_k: k,
            temperature: 0.9,
            ..base.clone()
        });
    }
    for top_p in [0.05, 0.5, 0.9, 0.999] {
        cases.push(SamplingParams {
            top_p,
            ..base.clone()
        });
    }
    for min_p in [0.01, 0.2, 0.9] {
        cases.push(SamplingParams {
            min_p,
            ..base.clone()
        });
    }
    for typical_p in [0.2, 0.6, 0.95] {
        cases.push(SamplingParams {
            typical_p,
            ..base.clone()
        });
    }
    cases.push(SamplingParams {
        top_k: 20,
        top_p: 0.8,
        min_p: 0.05,
        typical_p: 0.9,
        ..base.clone()
    });
    cases.push(SamplingParams {
        top_p: 0.7,
        min_p: 0.1,
        ..base.clone()
    });
    cases.push(SamplingParams {
        top_p: 0.95,
        typical_p: 0.5,
        ..base.clone()
    });
    cases.push(SamplingParams {
        min_p: 0.05,
        typical_p: 0.7,
        ..base
    });
    cases
}

#[test]
fn filters_match_the_naive_distribution() {
    for (c, p) in filter_cases().iter().enumerate() {
        for (vocab, scale) in [(VOCAB, 6.0), (5000, 3.0), (5000, 30.0)] {
            let mut x = random_row(vocab, 7 * c as u64 + vocab as u64, scale);
            x[3] = f32::NEG_INFINITY;
            x[4] = f32::NAN;
            let got = filtered_probs(&x, p);
            assert_close(
                &got,
                &naive::filtered(&x, p),
                &format!("case {c} vocab {vocab}"),
            );
            let sum: f64 = got.iter().map(|&q| f64::from(q)).sum();
            assert!(
                (sum - 1.0).abs() < 1e-5,
                "case {c}: probabilities sum to {sum}"
            );
        }
    }
}

#[test]
fn top_k_at_vocab_and_top_p_one_change_nothing() {
    let x = random_row(VOCAB, 9, 5.0);
    let plain = filtered_probs(&x, &SamplingParams::default());
    for p in [
        SamplingParams {
            top_k: VOCAB as u32,
            ..SamplingParams::default()
        },
        SamplingParams {
            top_k: 1 << 30,
            ..SamplingParams::default()
        },
        SamplingParams {
            top_p: 1.0,
            min_p: 0.0,
            typical_p: 1.0,
            ..SamplingParams::default()
        },
    ] {
        assert_eq!(filtered_probs(&x, &p), plain);
    }
}

#[test]
fn top_k_breaks_ties_by_id_and_greedy_is_one_hot() {
    let x = [1.0, 3.0, 3.0, 3.0, 0.0];
    let p = SamplingParams {
        top_k: 2,
        ..SamplingParams::default()
    };
    assert_eq!(filtered_probs(&x, &p), [0.0, 0.5, 0.5, 0.0, 0.0]);
    let greedy = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    assert_eq!(filtered_probs(&x, &greedy), [0.0, 1.0, 0.0, 0.0, 0.0]);
    let top1 = SamplingParams {
        top_k: 1,
        ..SamplingParams::default()
    };
    assert_eq!(filtered_probs(&x, &top1), [0.0, 1.0, 0.0, 0.0, 0.0]);
}

#[test]
fn infinite_and_empty_rows() {
    let x = [0.0, f32::INFINITY, 5.0, f32::INFINITY];
    assert_eq!(
        filtered_probs(&x, &SamplingParams::default()),
        [0.0, 0.5, 0.0, 0.5]
    );
    let p = SamplingParams {
        top_k: 1,
        temperature: 0.5,
        ..SamplingParams::default()
    };
    assert_eq!(filtered_probs(&x, &p), [0.0, 1.0, 0.0, 0.0]);
    let none = [f32::NEG_INFINITY, f32::NAN];
    assert_eq!(
        filtered_probs(&none, &SamplingParams::default()),
        [0.0, 0.0]
    );
}
