//! `best_of` > `n`: every candidate takes a seat, the first sequence forks into `best_of`
//! sequences, each drawn token carries its logprob even when the request asked for no logprobs,
//! and the candidates stay held until the last finishes, when the best `n` by the sum of their
//! logprobs come back ranked.

use std::sync::Arc;

use super::*;
use crate::error::CoreError;
use crate::params::SamplingParams;
use crate::types::FinishReason;

const VOCAB: usize = 16;

fn best_of(n: u32, best_of: u32, logprobs: Option<u32>) -> Arc<SamplingParams> {
    Arc::new(SamplingParams {
        n,
        best_of,
        max_tokens: Some(3),
        seed: Some(7),
        logprobs,
        ..SamplingParams::default()
    })
}

fn rejected_param(r: Result<(), CoreError>) -> String {
    match r {
        Err(CoreError::Invalid { param, code, .. }) => {
            assert_eq!(code, "out_of_range");
            param
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
}

/// Logits whose row `r` prefers token `r % VOCAB` a little (every token stays possible).
fn logits(num_rows: usize) -> Vec<f32> {
    let mut l = vec![0.0f32; num_rows * VOCAB];
    for (r, row) in l.chunks_mut(VOCAB).enumerate() {
        for (t, v) in row.iter_mut().enumerate() {
            *v = 0.25 * ((t + r) % VOCAB) as f32;
        }
    }
    l
}

#[test]
fn every_candidate_takes_a_seat() {
    let mut s = Scheduler::new(cfg(32, 4, 64, 4)).unwrap();
    add(&mut s, 1, vec![1, 2, 3], best_of(1, 4, None), 5, 0.0);
    add(&mut s, 2, vec![4, 5], best_of(1, 1, None), 5, 0.0);
    let (plan, _) = step(&mut s, 0.0, 9);
    assert_eq!(
        plan.req_ids,
        vec![1],
        "request 1 holds all 4 seats (best_of), so request 2 waits"
    );
    assert_eq!(
        s.stats().num_running_seqs,
        4,
        "forked into best_of sequences"
    );
    // The seats free as the candidates finish (max_tokens 3), then request 2 runs.
    let mut admitted = false;
    for _ in 0..3 {
        admitted |= step(&mut s, 0.0, 9).0.req_ids.contains(&2);
    }
    assert!(admitted);
}

#[test]
fn best_of_above_max_num_seqs_is_refused_by_name() {
    let mut s = Scheduler::new(cfg(32, 4, 64, 4)).unwrap();
    let too_many = req(1, vec![1], best_of(2, 5, None), 5, 0.0);
    assert_eq!(rejected_param(s.add_request(too_many)), "best_of");
    let too_many = req(1, vec![1], best_of(5, 5, None), 5, 0.0);
    assert_eq!(rejected_param(s.add_request(too_many)), "n");
    s.add_request(req(1, vec![1], best_of(2, 4, None), 5, 0.0))
        .unwrap();
}

#[test]
fn the_prompt_forks_into_best_of_sequences() {
    let mut s = Scheduler::new(cfg(32, 4, 64, 8)).unwrap();
    add(
        &mut s,
        1,
        vec![1, 2, 3, 4, 5, 6],
        best_of(2, 5, None),
        5,
        0.0,
    );
    let plan = s.schedule(0.0);
    assert_eq!(plan.num_samples(), 5);
    assert_eq!(plan.sample_seq_indices, vec![0, 1, 2, 3, 4]);
    let out = s.update(plan.step_id, &[10, 11, 12, 13, 14]).unwrap();
    s.check_invariants().unwrap();
    assert_eq!(out.num_samples(), 0, "the candidates are held");
    assert_eq!(out.held_req_ids, vec![1]);
    assert_eq!(s.sequences().len(), 5);
    let full = s.sequences()[0].block_table[0];
    assert_eq!(s.pool().ref_count(full), 5, "the prompt block is shared");
    let (plan, _) = step(&mut s, 0.0, 9);
    assert_eq!(plan.input_ids, vec![10, 11, 12, 13, 14]);
}

#[test]
fn ranking_computes_token_logprobs_that_were_not_asked_for() {
    let mut s = Scheduler::new(cfg(32, 4, 64, 8)).unwrap();
    // One token each: request 1's candidates all finish in the first step, which shows the best.
    let one_token = Arc::new(SamplingParams {
        max_tokens: Some(1),
        ..(*best_of(1, 3, None)).clone()
    });
    add(&mut s, 1, vec![1, 2, 3], one_token, 5, 0.0);
    add(&mut s, 2, vec![1, 2, 3], best_of(2, 2, None), 5, 0.0);
    add(&mut s, 3, vec![1, 2, 3], best_of(2, 2, Some(0)), 5, 0.0);
    let plan = s.schedule(0.0);
    assert_eq!(plan.num_samples(), 7);
    let raw = logits(plan.num_samples());
    let out = s.update_with_logits(plan.step_id, &raw, VOCAB).unwrap();
    assert_eq!(
        out.req_ids,
        vec![1, 2, 2, 3, 3],
        "request 1 shows its best candidate"
    );
    assert_eq!(out.num_top_logprobs, 0, "ranking asks for no alternatives");
    // Raw mode: the log-softmax of the unprocessed logits row of the sample.
    let raw_logprob = |row: usize, token: u32| {
        let row = &raw[row * VOCAB..][..VOCAB];
        let ln_z = row.iter().map(|v| f64::from(*v).exp()).sum::<f64>().ln();
        f64::from(row[token as usize]) - ln_z
    };
    for (i, (&req, &lp)) in out.req_ids.iter().zip(&out.logprobs).enumerate() {
        if req == 2 {
            assert!(lp.is_nan(), "n = best_of without logprobs: none computed");
            continue;
        }
        // Request 1's entry came from one of its three sample rows; the others from row i + 2.
        let rows = if req == 1 { 0..3 } else { i + 2..i + 3 };
        let close = |row| (f64::from(lp) - raw_logprob(row, out.token_ids[i])).abs() < 1e-5;
        assert!(rows.clone().any(close), "sample {i}: {lp}");
    }
}

/// The same seeded request with `n = best_of`: its sequences are exactly the candidates.
fn candidates(p: &SamplingParams, steps: &[Vec<f32>]) -> Vec<(Vec<u32>, Vec<f32>)> {
    let mut s = Scheduler::new(cfg(64, 4, 64, 8)).unwrap();
    let all = SamplingParams {
        n: p.best_of,
        logprobs: Some(0),
        ..p.clone()
    };
    add(&mut s, 1, vec![1, 2, 3], Arc::new(all), 5, 0.0);
    let mut seqs = vec![(Vec::new(), Vec::new()); p.best_of as usize];
    for raw in steps {
        let plan = s.schedule(0.0);
        let out = s.update_with_logits(plan.step_id, &raw[..plan.num_samples() * VOCAB], VOCAB);
        let out = out.unwrap();
        for i in 0..out.num_samples() {
            let seq = &mut seqs[out.seq_indices[i] as usize];
            seq.0.push(out.token_ids[i]);
            seq.1.push(out.logprobs[i]);
        }
    }
    assert!(!s.has_unfinished_requests());
    seqs
}

#[test]
fn candidates_stay_held_until_the_last_ends_then_the_best_n_come_back_ranked() {
    let mut p = SamplingParams {
        max_tokens: Some(4),
        temperature: 1.5,
        ..(*best_of(2, 5, None)).clone()
    };
    let steps: Vec<Vec<f32>> = (0..4)
        .map(|k| logits(5 + k)[k * VOCAB..].to_vec())
        .collect();
    // Stop token ids that end two of the candidates early (tokens they draw).
    let probe = candidates(&p, &steps);
    p.stop_token_ids = vec![probe[0].0[1], probe[3].0[2]];
    let mut want = candidates(&p, &steps);
    let sum = |lps: &[f32]| lps.iter().map(|&l| f64::from(l)).sum::<f64>();
    let mut order: Vec<usize> = (0..want.len()).collect();
    order.sort_by(|&a, &b| sum(&want[b].1).total_cmp(&sum(&want[a].1)).then(a.cmp(&b)));
    assert_ne!(order[..2], [0, 1], "ranking reorders the candidates");
    let lengths: Vec<usize> = want.iter().map(|c| c.0.len()).collect();
    assert!(
        lengths.contains(&4) && lengths.iter().any(|&l| l < 4),
        "{lengths:?}"
    );
    want = order.into_iter().take(2).map(|i| want[i].clone()).collect();
    let mut s = Scheduler::new(cfg(64, 4, 64, 8)).unwrap();
    add(&mut s, 1, vec![1, 2, 3], Arc::new(p), 5, 0.0);
    let mut got = vec![(Vec::new(), Vec::new()); 2];
    for (k, raw) in steps.iter().enumerate() {
        let plan = s.schedule(0.0);
        let out = s.update_with_logits(plan.step_id, &raw[..plan.num_samples() * VOCAB], VOCAB);
        let out = out.unwrap();
        s.check_invariants().unwrap();
        if s.has_unfinished_requests() {
            assert_eq!(
                (out.num_samples(), out.held_req_ids.clone()),
                (0, vec![1]),
                "step {k}"
            );
            continue;
        }
        assert!(out.held_req_ids.is_empty() && out.finished_req_ids == vec![1]);
        for i in 0..out.num_samples() {
            let seq = &mut got[out.seq_indices[i] as usize];
            seq.0.push(out.token_ids[i]);
            seq.1.push(out.logprobs[i]);
        }
        assert_ne!(out.finish_reasons.iter().filter(|&&f| f != 0).count(), 0);
    }
    assert_eq!(got, want);
}

#[test]
fn an_abort_shows_the_best_n_of_what_exists() {
    let p = Arc::new(SamplingParams {
        max_tokens: Some(50),
        ..(*best_of(2, 4, None)).clone()
    });
    let mut s = Scheduler::new(cfg(64, 4, 64, 8)).unwrap();
    add(&mut s, 1, vec![1, 2, 3], p, 5, 0.0);
    for _ in 0..3 {
        let plan = s.schedule(0.0);
        let raw = logits(plan.num_samples());
        let out = s.update_with_logits(plan.step_id, &raw, VOCAB).unwrap();
        assert_eq!(out.held_req_ids, vec![1]);
    }
    assert!(s.abort_request(crate::types::RequestId(1)));
    let plan = s.schedule(0.0);
    assert_eq!(plan.finished_req_ids, vec![1]);
    let out = s.update(plan.step_id, &[]).unwrap();
    assert_eq!(
        out.seq_indices,
        vec![0, 0, 0, 1, 1, 1],
        "the best 2, 3 tokens each"
    );
    let abort = FinishReason::Abort as u8;
    assert_eq!(out.finish_reasons, vec![0, 0, abort, 0, 0, abort]);
    let sums: Vec<f32> = out.logprobs.chunks(3).map(|c| c.iter().sum()).collect();
    assert!(sums[0] >= sums[1], "best first: {sums:?}");
    assert!(!s.has_unfinished_requests());
}

#[test]
fn processed_mode_ranks_by_the_distribution_sampled_from() {
    let mut s = Scheduler::new(SchedulerConfig {
        logprobs_mode: crate::sampling::LogprobsMode::Processed,
        ..cfg(32, 4, 64, 8)
    })
    .unwrap();
    let p = Arc::new(SamplingParams {
        top_k: 2,
        ..(*best_of(1, 3, None)).clone()
    });
    let p = Arc::new(SamplingParams {
        max_tokens: Some(1),
        ..(*p).clone()
    });
    add(&mut s, 1, vec![1, 2, 3], p, 5, 0.0);
    let plan = s.schedule(0.0);
    let raw = logits(1);
    let reps: Vec<f32> = raw.iter().cycle().take(3 * VOCAB).copied().collect();
    let out = s.update_with_logits(plan.step_id, &reps, VOCAB).unwrap();
    assert_eq!(
        out.num_samples(),
        1,
        "the best of the 3 one-token candidates"
    );
    // Top-2 of row 0 keeps tokens 15 and 14 (logits 3.75, 3.5), renormalised.
    let ln_z = (3.75f64.exp() + 3.5f64.exp()).ln();
    for (&t, &lp) in out.token_ids.iter().zip(&out.logprobs) {
        assert!(t == 15 || t == 14, "drawn from the top 2; got {t}");
        let want = 0.25 * f64::from(t) - ln_z;
        assert!((f64::from(lp) - want).abs() < 1e-5, "{lp} vs {want}");
    }
}
