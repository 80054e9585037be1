//! Scheduler tests: behaviour of each rule, then seeded randomized workloads checked against the
//! invariants and a shadow KV cache that plays the model runner.

use std::sync::Arc;

use super::*;
use crate::error::CoreError;
use crate::params::{EarlyStopping, SamplingParams};
use crate::types::{FinishReason, RequestId, SeqStatus};

fn cfg(num_blocks: usize, block_size: usize, budget: usize, max_seqs: usize) -> SchedulerConfig {
    SchedulerConfig {
        num_blocks,
        block_size,
        max_num_seqs: max_seqs,
        max_num_batched_tokens: budget,
        max_model_len: 64.min((num_blocks - 1) * block_size),
        max_num_waiting: 64,
        enable_prefix_caching: true,
        priority_aging_s: 0.0,
        eos_token_ids: vec![0],
        ..SchedulerConfig::default()
    }
}

fn params(n: u32, max_tokens: u32) -> Arc<SamplingParams> {
    Arc::new(SamplingParams::new(n.into(), Some(max_tokens.into()), 0, false, vec![]).unwrap())
}

/// A request with a priority and an arrival time.
fn req(id: u64, prompt: Vec<u32>, p: Arc<SamplingParams>, priority: i64, t: f64) -> NewRequest {
    NewRequest {
        priority: Some(priority),
        arrival_time: t,
        ..NewRequest::new(id, prompt, p)
    }
}

fn add(
    s: &mut Scheduler,
    id: u64,
    prompt: Vec<u32>,
    p: Arc<SamplingParams>,
    priority: i64,
    t: f64,
) {
    s.add_request(req(id, prompt, p, priority, t)).unwrap();
}

/// Runs one step, sampling `token` for every sample.
fn step(s: &mut Scheduler, now: f64, token: u32) -> (StepPlan, StepOutput) {
    let plan = s.schedule(now);
    s.check_invariants().unwrap();
    let sampled = vec![token; plan.num_samples()];
    let out = s.update(plan.step_id, &sampled).unwrap();
    s.check_invariants().unwrap();
    (plan, out)
}

#[test]
fn prefill_then_decode_fills_every_column() {
    let mut s = Scheduler::new(cfg(8, 4, 64, 4)).unwrap();
    add(
        &mut s,
        7,
        vec![11, 12, 13, 14, 15, 16],
        params(1, 2),
        5,
        0.0,
    );
    let (plan, out) = step(&mut s, 0.0, 99);
    assert_eq!(plan.input_ids, vec![11, 12, 13, 14, 15, 16]);
    assert_eq!(plan.positions, vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(
        plan.slot_mapping,
        vec![4, 5, 6, 7, 8, 9],
        "blocks 1 and 2 of size 4"
    );
    assert_eq!(
        (plan.cu_seqlens_q.clone(), plan.context_lens.clone()),
        (vec![0, 6], vec![6])
    );
    assert_eq!(
        (plan.block_tables.clone(), plan.max_num_blocks),
        (vec![1, 2], 2)
    );
    assert_eq!(
        (plan.logits_indices.clone(), plan.sample_rows.clone()),
        (vec![5], vec![0])
    );
    assert_eq!((plan.num_prefill_tokens, plan.num_decode_tokens), (6, 0));
    assert_eq!(
        (
            out.req_ids.clone(),
            out.token_ids.clone(),
            out.finish_reasons.clone()
        ),
        (vec![7], vec![99], vec![0])
    );
    let (plan, out) = step(&mut s, 0.0, 98);
    assert_eq!(
        (
            plan.input_ids.clone(),
            plan.positions.clone(),
            plan.slot_mapping.clone()
        ),
        (vec![99], vec![6], vec![10])
    );
    assert_eq!((plan.num_prefill_tokens, plan.num_decode_tokens), (0, 1));
    assert_eq!(out.finish_reasons, vec![FinishReason::Length as u8]);
    assert_eq!(out.finished_req_ids, vec![7]);
    assert!(!s.has_unfinished_requests());
    assert_eq!(s.pool().num_free(), 7, "all blocks back");
}

#[test]
fn chunked_prefill_spends_the_budget_and_samples_only_at_the_end() {
    let mut s = Scheduler::new(cfg(16, 4, 4, 4)).unwrap();
    add(&mut s, 1, (1..=10).collect(), params(1, 1), 5, 0.0);
    let (p1, o1) = step(&mut s, 0.0, 5);
    let (p2, o2) = step(&mut s, 0.0, 5);
    let (p3, o3) = step(&mut s, 0.0, 5);
    assert_eq!(
        [
            p1.num_scheduled_tokens(),
            p2.num_scheduled_tokens(),
            p3.num_scheduled_tokens()
        ],
        [4, 4, 2]
    );
    assert_eq!(
        [p1.num_samples(), p2.num_samples(), p3.num_samples()],
        [0, 0, 1]
    );
    assert_eq!(p2.positions, vec![4, 5, 6, 7]);
    assert!(o1.token_ids.is_empty() && o2.token_ids.is_empty());
    assert_eq!(o3.finished_req_ids, vec![1]);
}

#[test]
fn prefix_cache_reuses_full_blocks_but_always_computes_the_last_token() {
    let mut s = Scheduler::new(cfg(32, 4, 64, 4)).unwrap();
    let prompt: Vec<u32> = (1..=10).collect();
    add(&mut s, 1, prompt.clone(), params(1, 1), 5, 0.0);
    step(&mut s, 0.0, 3);
    add(&mut s, 2, prompt.clone(), params(1, 1), 5, 1.0);
    let (plan, _) = step(&mut s, 1.0, 3);
    assert_eq!(plan.positions, vec![8, 9], "two full blocks of 4 reused");
    // A prompt that is exactly two blocks reuses only the first: its last token needs logits.
    add(&mut s, 3, prompt[..8].to_vec(), params(1, 1), 5, 2.0);
    let (plan, _) = step(&mut s, 2.0, 3);
    assert_eq!(plan.positions, vec![4, 5, 6, 7]);
    // A different cache salt (extra key) shares nothing.
    s.add_request(NewRequest {
        cache_salt: Some("tenant-b".into()),
        ..req(4, prompt.clone(), params(1, 1), 5, 3.0)
    })
    .unwrap();
    let (plan, _) = step(&mut s, 3.0, 3);
    assert_eq!(plan.num_scheduled_tokens(), 10);
    let st = s.stats();
    assert!(
        st.num_prefix_hit_blocks >= 3 && st.num_prefix_queried_blocks > st.num_prefix_hit_blocks
    );
}

#[test]
fn token_level_stops() {
    let mk = |min_tokens, ignore_eos, stop: Vec<u32>| {
        Arc::new(SamplingParams::new(1, Some(10), min_tokens, ignore_eos, stop).unwrap())
    };
    let cases = [
        (mk(0, false, vec![]), 0, Some(FinishReason::Stop)),
        (mk(2, false, vec![]), 0, None),
        (mk(0, true, vec![]), 0, None),
        (mk(0, true, vec![42]), 42, Some(FinishReason::Stop)),
        (mk(0, false, vec![]), 5, None),
    ];
    for (i, (p, token, want)) in cases.into_iter().enumerate() {
        let mut s = Scheduler::new(cfg(16, 4, 64, 4)).unwrap();
        add(&mut s, 1, vec![1, 2, 3], p, 5, 0.0);
        let (_, out) = step(&mut s, 0.0, token);
        assert_eq!(
            out.finish_reasons,
            vec![want.map_or(0, |f| f as u8)],
            "case {i}"
        );
    }
    // max_model_len caps prompt + output.
    let mut s = Scheduler::new(cfg(32, 4, 64, 4)).unwrap();
    add(
        &mut s,
        1,
        vec![1; 62],
        Arc::new(SamplingParams::default()),
        5,
        0.0,
    );
    step(&mut s, 0.0, 5);
    let (_, out) = step(&mut s, 0.0, 5);
    assert_eq!(out.finish_reasons, vec![FinishReason::Length as u8]);
}

#[test]
fn running_sequence_short_of_blocks_preempts_the_lowest_priority_latest_arrival() {
    // 4 usable blocks of 2 tokens. Three requests of 3 prompt tokens take 2 blocks each... only two fit.
    let mut s = Scheduler::new(SchedulerConfig {
        max_model_len: 8,
        ..cfg(5, 2, 64, 4)
    })
    .unwrap();
    add(&mut s, 1, vec![1, 2, 3], params(1, 4), 2, 0.0);
    add(&mut s, 2, vec![4, 5, 6], params(1, 4), 5, 1.0);
    let (plan, _) = step(&mut s, 2.0, 9);
    assert_eq!(plan.req_ids, vec![1, 2]);
    // Both hold 2 blocks; position 3 still fits, position 4 needs a third block each.
    assert!(step(&mut s, 2.0, 9).0.preempted_req_ids.is_empty());
    let (plan, _) = step(&mut s, 2.0, 9);
    assert_eq!(plan.preempted_req_ids, vec![2], "priority 5 loses");
    assert_eq!(plan.req_ids, vec![1]);
    let mut finished = vec![];
    for _ in 0..20 {
        let (_, out) = step(&mut s, 3.0, 9);
        finished.extend(out.finished_req_ids);
    }
    assert_eq!(
        finished,
        vec![1, 2],
        "the preempted request resumes and finishes"
    );
}

#[test]
fn waiting_higher_priority_preempts_lower_priority_running_for_a_seat() {
    let mut s = Scheduler::new(cfg(32, 4, 64, 1)).unwrap();
    add(&mut s, 1, vec![1, 2, 3], params(1, 8), 5, 0.0);
    step(&mut s, 0.0, 7);
    add(&mut s, 2, vec![4, 5, 6], params(1, 8), 1, 1.0);
    let (plan, _) = step(&mut s, 1.0, 7);
    assert_eq!(
        (plan.preempted_req_ids.clone(), plan.req_ids.clone()),
        (vec![1], vec![2])
    );
    // Equal priority never preempts.
    add(&mut s, 3, vec![4, 5, 6], params(1, 8), 1, 2.0);
    let (plan, _) = step(&mut s, 2.0, 7);
    assert!(plan.preempted_req_ids.is_empty());
    assert_eq!(plan.req_ids, vec![2]);
}

#[test]
fn admission_follows_priority_then_arrival_and_aging_prevents_starvation() {
    let mut s = Scheduler::new(SchedulerConfig {
        priority_aging_s: 10.0,
        ..cfg(64, 4, 64, 1)
    })
    .unwrap();
    add(&mut s, 1, vec![1], params(1, 1), 5, 0.0);
    add(&mut s, 2, vec![1], params(1, 1), 3, 0.5);
    add(&mut s, 3, vec![1], params(1, 1), 3, 0.2);
    let order: Vec<u64> = (0..3).map(|_| step(&mut s, 1.0, 9).0.req_ids[0]).collect();
    assert_eq!(order, vec![3, 2, 1]);
    // Old priority-5 request vs a newer priority-1 one: after 40 s it ranks as 1 and arrived first.
    add(&mut s, 4, vec![1], params(1, 1), 5, 0.0);
    add(&mut s, 5, vec![1], params(1, 1), 1, 30.0);
    assert_eq!(step(&mut s, 40.0, 9).0.req_ids, vec![4]);
}

#[test]
fn fork_shares_prompt_blocks_and_copies_the_partial_block_on_write() {
    let mut s = Scheduler::new(cfg(32, 4, 64, 8)).unwrap();
    add(&mut s, 1, vec![1, 2, 3, 4, 5, 6], params(3, 4), 5, 0.0);
    let plan = s.schedule(0.0);
    assert_eq!(plan.logits_indices, vec![5, 5, 5]);
    assert_eq!(plan.sample_seq_indices, vec![0, 1, 2]);
    let out = s.update(plan.step_id, &[10, 20, 30]).unwrap();
    assert_eq!(out.seq_indices, vec![0, 1, 2]);
    s.check_invariants().unwrap();
    let full = s.sequences()[0].block_table[0];
    assert_eq!(
        s.pool().ref_count(full),
        3,
        "the full prompt block is shared"
    );
    let (plan, _) = step(&mut s, 0.0, 40);
    assert_eq!(
        plan.block_copies.len() / 2,
        2,
        "two of three writers copy the shared partial block"
    );
    assert_eq!(plan.input_ids, vec![10, 20, 30]);
    assert_eq!(s.pool().ref_count(full), 3);
}

#[test]
fn abort_and_deadline_end_requests_at_the_next_schedule_and_free_blocks() {
    let mut s = Scheduler::new(cfg(32, 4, 64, 8)).unwrap();
    add(&mut s, 1, vec![1, 2, 3], params(1, 30), 5, 0.0);
    s.add_request(NewRequest {
        deadline: Some(5.0),
        ..req(2, vec![1, 2, 3], params(1, 30), 5, 0.0)
    })
    .unwrap();
    step(&mut s, 0.0, 9);
    assert!(s.abort_request(RequestId(1)));
    assert!(!s.abort_request(RequestId(99)));
    let (plan, _) = step(&mut s, 1.0, 9);
    assert_eq!(
        (plan.finished_req_ids.clone(), plan.finished_reasons.clone()),
        (vec![1], vec![FinishReason::Abort as u8])
    );
    let (plan, _) = step(&mut s, 5.0, 9);
    assert_eq!(
        (plan.finished_req_ids.clone(), plan.finished_reasons.clone()),
        (vec![2], vec![FinishReason::Timeout as u8])
    );
    assert_eq!(plan.num_rows(), 0);
    assert_eq!(s.pool().num_free(), 31);
}

#[test]
fn rejects_bad_requests_a_full_queue_and_stale_plans() {
    let mut s = Scheduler::new(SchedulerConfig {
        max_num_waiting: 1,
        ..cfg(32, 4, 64, 2)
    })
    .unwrap();
    let p = params(1, 1);
    let err = |r: Result<(), CoreError>| match r {
        Err(CoreError::Invalid { param, .. }) => param,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        err(s.add_request(req(1, vec![], p.clone(), 5, 0.0))),
        "prompt_token_ids"
    );
    assert_eq!(
        err(s.add_request(req(1, vec![1; 64], p.clone(), 5, 0.0))),
        "prompt_token_ids"
    );
    assert_eq!(
        err(s.add_request(req(1, vec![1], p.clone(), 0, 0.0))),
        "priority"
    );
    assert_eq!(
        err(s.add_request(req(1, vec![1], p.clone(), 6, 0.0))),
        "priority"
    );
    assert_eq!(
        err(s.add_request(req(1, vec![1], params(3, 1), 5, 0.0))),
        "n"
    );
    assert_eq!(
        err(s.add_request(NewRequest {
            deadline: Some(f64::NAN),
            ..req(1, vec![1], p.clone(), 5, 0.0)
        })),
        "deadline"
    );
    add(&mut s, 1, vec![1], p.clone(), 5, 0.0);
    assert_eq!(
        err(s.add_request(req(1, vec![1], p.clone(), 5, 0.0))),
        "request_id"
    );
    assert_eq!(
        s.add_request(req(2, vec![1], p.clone(), 5, 0.0)),
        Err(CoreError::QueueFull { max_num_waiting: 1 })
    );
    let plan = s.schedule(0.0);
    assert!(matches!(
        s.update(plan.step_id + 1, &[1]),
        Err(CoreError::StalePlan { .. })
    ));
    assert!(matches!(
        s.update(plan.step_id, &[1, 2]),
        Err(CoreError::Invalid { ref param, .. }) if param == "sampled_token_ids"
    ));
    s.update(plan.step_id, &[1]).unwrap();
    assert!(matches!(
        s.update(plan.step_id, &[1]),
        Err(CoreError::StalePlan { .. })
    ));
    assert!(
        Scheduler::new(SchedulerConfig {
            num_blocks: 4,
            ..cfg(32, 4, 64, 2)
        })
        .is_err(),
        "64 tokens need 16 blocks"
    );
}

#[test]
fn waiting_order_is_the_queue_by_priority_then_arrival() {
    // One seat: the first request runs, the others wait.
    let mut s = Scheduler::new(cfg(16, 4, 64, 1)).unwrap();
    add(&mut s, 1, vec![5, 6], params(1, 4), 3, 0.0);
    step(&mut s, 0.0, 9);
    add(&mut s, 2, vec![5, 6], params(1, 4), 3, 1.0);
    add(&mut s, 3, vec![5, 6], params(1, 4), 3, 2.0);
    add(&mut s, 4, vec![5, 6], params(1, 4), 1, 3.0);
    let ids = |order: Vec<RequestId>| order.into_iter().map(|r| r.0).collect::<Vec<_>>();
    assert_eq!(
        ids(s.waiting_order(3.0)),
        vec![4, 2, 3],
        "priority 1 first, then arrival"
    );
    // Priority 1 takes the seat; the preempted request waits at the front of its level.
    step(&mut s, 3.0, 9);
    assert_eq!(ids(s.waiting_order(3.0)), vec![1, 2, 3]);
}

mod best_of;
mod failures;
mod grammar;
mod logprob_bytes;
mod lora;
mod media;
mod prefill;
mod speculative;
mod workload;
