//! `best_of` > `n`: every candidate takes a seat, the first sequence forks into `best_of`
//! sequences, and each drawn token carries its logprob (the engine ranks candidates by the sum)
//! even when the request asked for no logprobs.

use std::sync::Arc;

use super::*;
use crate::error::CoreError;
use crate::params::SamplingParams;

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
    assert_eq!(out.seq_indices, vec![0, 1, 2, 3, 4]);
    assert_eq!(s.sequences().len(), 5);
    let full = s.sequences()[0].block_table[0];
    assert_eq!(s.pool().ref_count(full), 5, "the prompt block is shared");
    let (plan, _) = step(&mut s, 0.0, 9);
    assert_eq!(plan.input_ids, vec![10, 11, 12, 13, 14]);
}

#[test]
fn ranking_computes_token_logprobs_that_were_not_asked_for() {
    let mut s = Scheduler::new(cfg(32, 4, 64, 8)).unwrap();
    add(&mut s, 1, vec![1, 2, 3], best_of(1, 3, None), 5, 0.0);
    add(&mut s, 2, vec![1, 2, 3], best_of(2, 2, None), 5, 0.0);
    add(&mut s, 3, vec![1, 2, 3], best_of(2, 2, Some(0)), 5, 0.0);
    let plan = s.schedule(0.0);
    assert_eq!(plan.num_samples(), 7);
    let raw = logits(plan.num_samples());
    let out = s.update_with_logits(plan.step_id, &raw, VOCAB).unwrap();
    assert_eq!(out.req_ids, vec![1, 1, 1, 2, 2, 3, 3]);
    assert_eq!(out.num_top_logprobs, 0, "ranking asks for no alternatives");
    for (i, (&req, &lp)) in out.req_ids.iter().zip(&out.logprobs).enumerate() {
        if req == 2 {
            assert!(lp.is_nan(), "n = best_of without logprobs: none computed");
            continue;
        }
        // Raw mode: the log-softmax of the unprocessed logits row of the sample.
        let row = &raw[i * VOCAB..][..VOCAB];
        let ln_z = row.iter().map(|v| f64::from(*v).exp()).sum::<f64>().ln();
        let want = f64::from(row[out.token_ids[i] as usize]) - ln_z;
        assert!(
            (f64::from(lp) - want).abs() < 1e-5,
            "sample {i}: {lp} vs {want}"
        );
    }
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
    add(&mut s, 1, vec![1, 2, 3], p, 5, 0.0);
    let plan = s.schedule(0.0);
    let raw = logits(1);
    let reps: Vec<f32> = raw.iter().cycle().take(3 * VOCAB).copied().collect();
    let out = s.update_with_logits(plan.step_id, &reps, VOCAB).unwrap();
    // Top-2 of row 0 keeps tokens 15 and 14 (logits 3.75, 3.5), renormalised.
    let ln_z = (3.75f64.exp() + 3.5f64.exp()).ln();
    for (&t, &lp) in out.token_ids.iter().zip(&out.logprobs) {
        assert!(t == 15 || t == 14, "drawn from the top 2; got {t}");
        let want = 0.25 * f64::from(t) - ln_z;
        assert!((f64::from(lp) - want).abs() < 1e-5, "{lp} vs {want}");
    }
}
