//! Prefill-only (embedding) mode: whole inputs packed by the token budget and seats in rank
//! order, one forward each, no samples, nothing kept after `update`.

use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::super::*;
use crate::error::CoreError;
use crate::params::SamplingParams;
use crate::types::RequestId;

fn prefill_cfg(budget: usize, max_seqs: usize, max_len: usize) -> SchedulerConfig {
    SchedulerConfig {
        num_blocks: budget.div_ceil(4) + max_seqs + 1,
        block_size: 4,
        max_num_seqs: max_seqs,
        max_num_batched_tokens: budget,
        max_model_len: max_len,
        max_num_waiting: 1000,
        enable_prefix_caching: false,
        priority_aging_s: 0.0,
        ..SchedulerConfig::default()
    }
}

fn plain() -> Arc<SamplingParams> {
    Arc::new(SamplingParams::default())
}

fn input(id: u64, len: usize, priority: i64, t: f64) -> NewRequest {
    NewRequest {
        priority: Some(priority),
        arrival_time: t,
        ..NewRequest::new(id, vec![7; len], plain())
    }
}

/// Schedules and ends one step: the request ids of its rows, after checking that it samples
/// nothing and leaves no block held.
fn run_step(s: &mut PrefillScheduler, now: f64) -> Vec<u64> {
    let plan = s.schedule(now);
    s.check_invariants().unwrap();
    assert_eq!(plan.num_samples(), 0, "prefill-only rows sample nothing");
    assert_eq!(plan.num_decode_tokens, 0);
    let out = s.update(plan.step_id, &[]).unwrap();
    s.check_invariants().unwrap();
    assert_eq!(
        out.finished_req_ids, plan.req_ids,
        "every row ends, in row order"
    );
    assert_eq!(
        s.stats().num_used_blocks,
        0,
        "no block kept after the forward"
    );
    assert_eq!(s.stats().num_running_seqs, 0);
    plan.req_ids
}

#[test]
fn packs_whole_inputs_in_order_within_budget_and_seats() {
    let mut s = PrefillScheduler::new(prefill_cfg(10, 3, 10)).unwrap();
    for (id, len) in [
        (1, 5),
        (2, 5),
        (3, 5),
        (4, 10),
        (5, 1),
        (6, 1),
        (7, 1),
        (8, 1),
    ] {
        s.add_request(input(id, len, 3, id as f64)).unwrap();
    }
    let plan = s.schedule(100.0);
    // Whole rows: 5 + 5 fill the budget; the third 5 is not chunked into what is left.
    assert_eq!(plan.req_ids, vec![1, 2]);
    assert_eq!(plan.cu_seqlens_q, vec![0, 5, 10]);
    assert_eq!(plan.positions, [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]);
    assert_eq!(plan.context_lens, vec![5, 5]);
    assert!(plan.logits_indices.is_empty());
    assert_eq!(
        s.stats().num_used_blocks,
        4,
        "blocks are held during the forward only"
    );
    s.update(plan.step_id, &[]).unwrap();
    // 10 tokens do not fit beside the 5 left at the head: it waits (no overtaking).
    assert_eq!(run_step(&mut s, 101.0), vec![3]);
    assert_eq!(run_step(&mut s, 102.0), vec![4]);
    // Seats: at most 3 rows even though the budget takes 4 tokens.
    assert_eq!(run_step(&mut s, 103.0), vec![5, 6, 7]);
    assert_eq!(run_step(&mut s, 104.0), vec![8]);
    assert!(!s.has_unfinished_requests());
    assert!(run_step(&mut s, 105.0).is_empty());
}

#[test]
fn priority_first_then_arrival() {
    let mut s = PrefillScheduler::new(prefill_cfg(4, 8, 4)).unwrap();
    s.add_request(input(1, 2, 3, 1.0)).unwrap();
    s.add_request(input(2, 2, 5, 0.5)).unwrap();
    s.add_request(input(3, 2, 1, 2.0)).unwrap();
    s.add_request(input(4, 2, 3, 1.5)).unwrap();
    assert_eq!(run_step(&mut s, 10.0), vec![3, 1]);
    assert_eq!(run_step(&mut s, 10.0), vec![4, 2]);
}

#[test]
fn aborts_and_deadlines_end_waiting_inputs() {
    let mut s = PrefillScheduler::new(prefill_cfg(4, 8, 4)).unwrap();
    for id in 1..=4 {
        s.add_request(input(id, 2, 3, id as f64)).unwrap();
    }
    s.add_request(NewRequest {
        deadline: Some(5.0),
        ..input(5, 2, 3, 5.0)
    })
    .unwrap();
    assert!(s.abort_request(RequestId(2)));
    let plan = s.schedule(10.0);
    assert_eq!(plan.req_ids, vec![1, 3]);
    assert_eq!(plan.finished_req_ids, vec![2, 5]);
    assert_eq!(plan.finished_reasons, vec![3, 4]); // abort, timeout
    s.update(plan.step_id, &[]).unwrap();
    assert_eq!(run_step(&mut s, 11.0), vec![4]);
    assert_eq!(s.pool().num_free(), s.config().num_blocks - 1);
}

#[test]
fn refuses_what_does_not_fit_one_forward() {
    let bad = |cfg: SchedulerConfig| match PrefillScheduler::new(cfg).unwrap_err() {
        CoreError::Invalid { param, .. } => param,
        e => panic!("{e}"),
    };
    let cfg = prefill_cfg(8, 4, 8);
    assert_eq!(
        bad(SchedulerConfig {
            enable_prefix_caching: true,
            ..cfg.clone()
        }),
        "enable_prefix_caching"
    );
    assert_eq!(
        bad(SchedulerConfig {
            max_model_len: 9,
            ..cfg.clone()
        }),
        "max_num_batched_tokens"
    );
    let mut s = PrefillScheduler::new(cfg).unwrap();
    s.add_request(input(1, 8, 3, 0.0)).unwrap(); // max_model_len itself is fine: no output
    let refused = |s: &mut PrefillScheduler, r: NewRequest| match s.add_request(r).unwrap_err() {
        CoreError::Invalid { param, message, .. } => (param, message),
        e => panic!("{e}"),
    };
    let (param, message) = refused(&mut s, input(2, 9, 3, 0.0));
    assert_eq!(param, "prompt_token_ids");
    assert!(message.contains("at most max_model_len (8)"), "{message}");
    let two = Arc::new(SamplingParams::new(2, None, 0, false, vec![]).unwrap());
    let (param, _) = refused(&mut s, NewRequest::new(3, vec![1], two));
    assert_eq!(param, "n");
    // Logits cannot be handed in at all: `PrefillScheduler` has no `update_with_logits`.
    let plan = s.schedule(0.0);
    s.update(plan.step_id, &[]).unwrap();
    assert!(!s.has_unfinished_requests());
}

/// Random inputs arriving between steps: every input runs exactly once, whole, steps stay
/// within budget and seats, admission follows arrival, and no block outlives its step.
#[test]
fn random_arrivals_pack_within_limits_and_leak_nothing() {
    for seed in 0..20 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (budget, seats) = (rng.random_range(16..80), rng.random_range(1..9));
        let mut s = PrefillScheduler::new(prefill_cfg(budget, seats, budget)).unwrap();
        let mut lens = Vec::new();
        let mut order = Vec::new();
        let mut now = 0.0;
        while order.len() < 200 {
            for _ in 0..rng.random_range(0..6) {
                if lens.len() < 200 {
                    let id = lens.len() as u64;
                    lens.push(rng.random_range(1..=budget));
                    s.add_request(input(id, lens[id as usize], 3, now)).unwrap();
                }
            }
            now += 1.0;
            let plan = s.schedule(now);
            assert!(plan.num_scheduled_tokens() <= budget && plan.num_rows() <= seats);
            for (r, &id) in plan.req_ids.iter().enumerate() {
                let len = (plan.cu_seqlens_q[r + 1] - plan.cu_seqlens_q[r]) as usize;
                assert_eq!(len, lens[id as usize], "seed {seed}: input {id} runs whole");
            }
            s.update(plan.step_id, &[]).unwrap();
            assert_eq!(s.stats().num_used_blocks, 0);
            order.extend(plan.req_ids);
        }
        assert_eq!(order, (0..200).collect::<Vec<u64>>(), "seed {seed}");
    }
}

#[test]
fn an_adapter_is_refused_naming_the_field() {
    let mut s = PrefillScheduler::new(prefill_cfg(64, 4, 32)).unwrap();
    let err = s
        .add_request(NewRequest {
            lora_id: 2,
            ..input(1, 4, 5, 0.0)
        })
        .unwrap_err();
    let CoreError::Invalid { param, .. } = err else {
        panic!("{err:?}");
    };
    assert_eq!(param, "lora_id");
}
