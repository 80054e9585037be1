//! `sample`: the draw against a naive inverse CDF, determinism, forks, errors and logprobs.

use super::naive;
use super::{random_ids, random_row, req};
use crate::error::CoreError;
use crate::params::SamplingParams;
use crate::sampling::{
    sample, uniform, LogprobsMode, SampleRequest, SampleResult, Sampled, SamplerConfig,
};

/// Every sample's draw; panics on a per-sample failure.
fn drawn(out: Vec<SampleResult>) -> Vec<Sampled> {
    out.into_iter().map(Result::unwrap).collect()
}

fn one(raw: &[f32], r: &SampleRequest<'_>, mode: LogprobsMode) -> Sampled {
    let cfg = SamplerConfig {
        logprobs_mode: mode,
    };
    let mut out = sample(raw, raw.len(), std::slice::from_ref(r), &cfg).unwrap();
    out.pop().unwrap().unwrap()
}

#[test]
fn greedy_takes_the_processed_argmax_with_ties_to_the_lowest_id() {
    let prompt = random_ids(30, 100, 5);
    let output = random_ids(10, 100, 6);
    let p = SamplingParams {
        temperature: 0.0,
        repetition_penalty: 1.5,
        presence_penalty: 1.0,
        ..SamplingParams::default()
    };
    for seed in 0..20 {
        let raw = random_row(100, seed, 4.0);
        let r = req(&p, &prompt, &output);
        let x = naive::process(&raw, &r);
        let best = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let want = x.iter().position(|&v| v == best).unwrap();
        assert_eq!(one(&raw, &r, LogprobsMode::Raw).token as usize, want);
    }
    let tied = [0.5, 2.0, 1.0, 2.0];
    assert_eq!(one(&tied, &req(&p, &[], &[]), LogprobsMode::Raw).token, 1);
}

#[test]
fn draws_are_the_inverse_cdf_of_the_naive_distribution() {
    let base = SamplingParams {
        repetition_penalty: 1.2,
        frequency_penalty: 0.3,
        ..SamplingParams::default()
    };
    let cases = [
        base.clone(),
        SamplingParams {
            top_k: 50,
            top_p: 0.9,
            temperature: 0.8,
            ..base.clone()
        },
        SamplingParams {
            top_p: 0.9,
            ..base.clone()
        },
        SamplingParams {
            min_p: 0.1,
            temperature: 1.3,
            ..base.clone()
        },
        SamplingParams {
            typical_p: 0.8,
            ..base.clone()
        },
        SamplingParams {
            top_k: 3000,
            top_p: 0.5,
            ..base
        },
    ];
    let output = random_ids(40, 64, 8);
    // 64 tokens: sorted lists; 20000 flat tokens: the histogram path of long lists.
    for (vocab, scale) in [(64, 6.0), (20_000, 1.0), (20_000, 12.0)] {
        let raw = random_row(vocab, vocab as u64, scale);
        for (c, p) in cases.iter().enumerate() {
            let probs = naive::filtered(&naive::process(&raw, &req(p, &[], &output)), p);
            let ranked = naive::ranked(&probs);
            for seed in 0..60 {
                let r = SampleRequest {
                    seed,
                    ..req(p, &[], &output)
                };
                let got = one(&raw, &r, LogprobsMode::Raw).token as usize;
                let u = uniform(seed, 0, output.len() as u64);
                let want = naive::inverse_cdf(&probs, &ranked, u);
                assert_eq!(got, want, "vocab {vocab} case {c} seed {seed}");
            }
        }
    }
}

fn batch<'a>(params: &'a [SamplingParams], hist: &'a [Vec<u32>]) -> Vec<SampleRequest<'a>> {
    (0..8)
        .map(|i| SampleRequest {
            row: i % 3,
            params: &params[i % params.len()],
            prompt: &hist[i],
            output: &hist[(i + 1) % hist.len()],
            seed: 1000 + i as u64,
            sample_index: i as u32 % 2,
            eos_token_ids: &[0],
            allowed: None,
        })
        .collect()
}

#[test]
fn seeded_draws_do_not_depend_on_the_batch_its_order_or_threads() {
    let vocab = 3000;
    let logits: Vec<f32> = (0..3)
        .flat_map(|r| random_row(vocab, 50 + r, 3.0))
        .collect();
    let params = [
        SamplingParams {
            top_k: 40,
            top_p: 0.9,
            repetition_penalty: 1.1,
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 0.7,
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        SamplingParams {
            min_p: 0.02,
            logprobs: Some(3),
            ..SamplingParams::default()
        },
    ];
    let hist: Vec<Vec<u32>> = (0..8).map(|i| random_ids(i * 5, vocab, i as u64)).collect();
    let reqs = batch(&params, &hist);
    let cfg = SamplerConfig::default();
    let all = drawn(sample(&logits, vocab, &reqs, &cfg).unwrap());
    let mut reversed: Vec<SampleRequest<'_>> = reqs.clone();
    reversed.reverse();
    let mut back = drawn(sample(&logits, vocab, &reversed, &cfg).unwrap());
    back.reverse();
    assert_eq!(all, back);
    for (r, want) in reqs.iter().zip(&all) {
        let alone = drawn(sample(&logits, vocab, std::slice::from_ref(r), &cfg).unwrap());
        assert_eq!(&alone[0], want);
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    assert_eq!(
        drawn(
            pool.install(|| sample(&logits, vocab, &reqs, &cfg))
                .unwrap()
        ),
        all
    );
}

#[test]
fn sample_index_and_position_change_the_draw() {
    let raw = vec![0.0f32; 1000];
    let p = SamplingParams::default();
    let short = vec![7u32; 3];
    let long = vec![7u32; 4];
    let mut differ = [0; 2];
    for seed in 0..50 {
        let mut r = req(&p, &[], &short);
        r.seed = seed;
        let base = one(&raw, &r, LogprobsMode::Raw).token;
        r.sample_index = 1;
        differ[0] += usize::from(one(&raw, &r, LogprobsMode::Raw).token != base);
        r.sample_index = 0;
        r.output = &long;
        differ[1] += usize::from(one(&raw, &r, LogprobsMode::Raw).token != base);
    }
    // On 1000 equally likely tokens, a collision has probability 1/1000 per seed.
    assert!(differ.iter().all(|&d| d >= 45), "{differ:?}");
}

#[test]
fn forks_sharing_a_row_draw_like_separate_samples() {
    let raw = random_row(500, 77, 2.0);
    let p = SamplingParams {
        top_p: 0.95,
        logprobs: Some(2),
        ..SamplingParams::default()
    };
    let prompt = random_ids(12, 500, 1);
    let forks: Vec<SampleRequest<'_>> = (0..4)
        .map(|i| SampleRequest {
            sample_index: i,
            seed: 9,
            ..req(&p, &prompt, &[])
        })
        .collect();
    let cfg = SamplerConfig {
        logprobs_mode: LogprobsMode::Processed,
    };
    let together = drawn(sample(&raw, 500, &forks, &cfg).unwrap());
    let copies: Vec<Vec<u32>> = (0..4).map(|_| prompt.clone()).collect();
    for (i, f) in forks.iter().enumerate() {
        let apart = SampleRequest {
            prompt: &copies[i],
            ..*f
        };
        assert_eq!(
            drawn(sample(&raw, 500, &[apart], &cfg).unwrap())[0],
            together[i]
        );
    }
    let distinct: std::collections::BTreeSet<u32> = together.iter().map(|s| s.token).collect();
    assert!(distinct.len() > 1, "four forks drew {distinct:?}");
}

fn param_of(err: CoreError) -> String {
    match err {
        CoreError::Invalid { param, .. } => param,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn bad_shapes_fail_the_call_and_bad_parameters_their_sample() {
    let p = SamplingParams::default();
    let r = req(&p, &[], &[]);
    let cfg = SamplerConfig::default();
    assert_eq!(
        param_of(sample(&[0.0; 7], 4, &[r], &cfg).unwrap_err()),
        "logits"
    );
    assert_eq!(
        param_of(sample(&[0.0; 8], 0, &[r], &cfg).unwrap_err()),
        "logits"
    );
    let far = SampleRequest { row: 2, ..r };
    assert_eq!(
        param_of(sample(&[0.0; 8], 4, &[far], &cfg).unwrap_err()),
        "logits"
    );
    let too_many = SamplingParams {
        logprobs: Some(21),
        ..p.clone()
    };
    let r2 = SampleRequest {
        params: &too_many,
        ..r
    };
    // A parameter the row cannot serve fails that sample alone, not the call.
    let out = sample(&[0.0; 8], 4, &[r, r2], &cfg).unwrap();
    assert!(out[0].is_ok());
    assert_eq!(param_of(out[1].clone().unwrap_err()), "logprobs");
}

#[test]
fn a_row_left_without_a_finite_logit_fails_its_sample_alone() {
    let p = SamplingParams::default();
    let r = req(&p, &[], &[]);
    let cfg = SamplerConfig::default();
    let rows = [0.0, 1.0, f32::NAN, f32::NAN, f32::NEG_INFINITY, f32::NAN];
    for params in [
        p.clone(),
        SamplingParams {
            temperature: 0.0,
            ..p.clone()
        },
    ] {
        let ok = SampleRequest {
            params: &params,
            ..r
        };
        let dead = SampleRequest { row: 2, ..ok };
        let out = sample(&rows, 2, &[ok, dead, ok], &cfg).unwrap();
        assert!(out[0].is_ok() && out[2].is_ok(), "batch-mates still draw");
        assert_eq!(param_of(out[1].clone().unwrap_err()), "logits[2]");
    }
    let banned = SamplingParams {
        allowed_token_ids: Some(vec![1]),
        min_tokens: 1,
        ..p.clone()
    };
    let r1 = SampleRequest {
        params: &banned,
        eos_token_ids: &[1],
        allowed: None,
        ..r
    };
    assert_eq!(
        param_of(
            sample(&rows, 2, &[r1], &cfg)
                .unwrap()
                .remove(0)
                .unwrap_err()
        ),
        "logits[0]"
    );
}

#[test]
fn nan_logits_are_never_drawn() {
    let mut raw = vec![0.0f32; 64];
    raw.iter_mut().step_by(2).for_each(|v| *v = f32::NAN);
    let p = SamplingParams::default();
    for seed in 0..200 {
        let r = SampleRequest {
            seed,
            ..req(&p, &[], &[])
        };
        assert_eq!(one(&raw, &r, LogprobsMode::Raw).token % 2, 1);
    }
}

fn assert_top_close(top: &[(u32, f32)], want: &[f64], k: usize) {
    let ids = naive::ranked(&want.iter().map(|l| l.exp()).collect::<Vec<_>>());
    assert_eq!(top.len(), k);
    for (i, &(id, lp)) in top.iter().enumerate() {
        if i < ids.len() {
            assert_eq!(id as usize, ids[i], "rank {i}");
        }
        let w = want[id as usize];
        assert!(
            lp == w as f32 || (f64::from(lp) - w).abs() < 1e-5,
            "rank {i}: {lp} vs {w}"
        );
    }
}

#[test]
fn logprobs_raw_and_processed_match_log_softmax() {
    let raw = random_row(3000, 4, 10.0);
    let output = random_ids(20, 3000, 3);
    let p = SamplingParams {
        top_k: 3,
        repetition_penalty: 1.3,
        temperature: 0.5,
        logprobs: Some(5),
        ..SamplingParams::default()
    };
    let r = req(&p, &[], &output);
    let got = one(&raw, &r, LogprobsMode::Raw);
    let want = naive::log_softmax(&raw);
    assert!((f64::from(got.logprob.unwrap()) - want[got.token as usize]).abs() < 1e-5);
    assert_top_close(&got.top_logprobs, &want, 5);

    let got = one(&raw, &r, LogprobsMode::Processed);
    let probs = naive::filtered(&naive::process(&raw, &r), &p);
    let want: Vec<f64> = probs.iter().map(|q| q.ln()).collect();
    assert!((f64::from(got.logprob.unwrap()) - want[got.token as usize]).abs() < 1e-5);
    // Three kept tokens, then the two lowest removed ids at -inf.
    assert_top_close(&got.top_logprobs, &want, 5);
    assert_eq!(
        got.top_logprobs[3..]
            .iter()
            .filter(|t| t.1 == f32::NEG_INFINITY)
            .count(),
        2
    );

    let greedy = SamplingParams {
        temperature: 0.0,
        ..p.clone()
    };
    let r = req(&greedy, &[], &output);
    let got = one(&raw, &r, LogprobsMode::Processed);
    let want = naive::log_softmax(&naive::process(&raw, &r));
    assert_top_close(&got.top_logprobs, &want, 5);
    let none = one(
        &raw,
        &req(&SamplingParams::default(), &[], &[]),
        LogprobsMode::Raw,
    );
    assert!(none.logprob.is_none() && none.top_logprobs.is_empty());
}

/// Greedy and top-k rows with only sparse processors run on an overlay of the raw row; a zero
/// `embedding_bias` (a dense processor that changes nothing) forces the copied row instead.
#[test]
fn in_place_and_copied_rows_give_the_same_draws() {
    let vocab = 4000;
    let mut raw = random_row(vocab, 21, 4.0);
    let prompt = random_ids(300, vocab, 22);
    let output = random_ids(200, vocab, 23);
    raw[output[0] as usize] = f32::NAN;
    raw[prompt[0] as usize] = f32::INFINITY;
    let (last, second) = (output[199], output[198]);
    let sparse = SamplingParams {
        logit_bias: vec![(3, 4.0), (prompt[0], f32::NEG_INFINITY), (9, 2.0)],
        bad_words: vec![vec![5], vec![second, last, 6]],
        min_tokens: 500,
        stop_token_ids: vec![7],
        no_repeat_ngram_size: 2,
        repetition_penalty: 1.4,
        presence_penalty: 0.6,
        frequency_penalty: 0.4,
        logprobs: Some(4),
        ..SamplingParams::default()
    };
    for (top_k, temperature) in [
        (1, 1.0),
        (0, 0.0),
        (1, 0.7),
        (7, 0.8),
        (60, 1.0),
        (900, 1.3),
    ] {
        let p = SamplingParams {
            top_k,
            temperature,
            top_p: 0.9,
            ..sparse.clone()
        };
        let dense = SamplingParams {
            embedding_bias: Some(vec![0.0; vocab].into()),
            ..p.clone()
        };
        for seed in 0..10 {
            for mode in [LogprobsMode::Raw, LogprobsMode::Processed] {
                let r = SampleRequest {
                    seed,
                    eos_token_ids: &[8],
                    allowed: None,
                    ..req(&p, &prompt, &output)
                };
                let d = SampleRequest {
                    params: &dense,
                    ..r
                };
                assert_eq!(
                    one(&raw, &r, mode),
                    one(&raw, &d, mode),
                    "k={top_k} t={temperature}"
                );
            }
        }
    }
}
