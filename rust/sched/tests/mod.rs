//! Scheduler tests: behaviour of each rule, then seeded randomized workloads checked against the
//! invariants and a shadow KV cache that plays the model runner.

use std::collections::HashMap;
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::error::CoreError;
use crate::params::SamplingParams;
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
    }
}

fn params(n: u32, max_tokens: u32) -> Arc<SamplingParams> {
    Arc::new(SamplingParams::new(n.into(), Some(max_tokens.into()), 0, false, vec![]).unwrap())
}

fn add(s: &mut Scheduler, id: u64, prompt: Vec<u32>, p: Arc<SamplingParams>, priority: u8, t: f64) {
    s.add_request(RequestId(id), prompt, p, priority, t, None, None)
        .unwrap();
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
    s.add_request(
        RequestId(4),
        prompt.clone(),
        params(1, 1),
        5,
        3.0,
        None,
        Some("tenant-b".into()),
    )
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
    s.add_request(
        RequestId(2),
        vec![1, 2, 3],
        params(1, 30),
        5,
        0.0,
        Some(5.0),
        None,
    )
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
        err(s.add_request(RequestId(1), vec![], p.clone(), 5, 0.0, None, None)),
        "prompt_token_ids"
    );
    assert_eq!(
        err(s.add_request(RequestId(1), vec![1; 64], p.clone(), 5, 0.0, None, None)),
        "prompt_token_ids"
    );
    assert_eq!(
        err(s.add_request(RequestId(1), vec![1], p.clone(), 0, 0.0, None, None)),
        "priority"
    );
    assert_eq!(
        err(s.add_request(RequestId(1), vec![1], p.clone(), 6, 0.0, None, None)),
        "priority"
    );
    assert_eq!(
        err(s.add_request(RequestId(1), vec![1], params(3, 1), 5, 0.0, None, None)),
        "n"
    );
    assert_eq!(
        err(s.add_request(
            RequestId(1),
            vec![1],
            p.clone(),
            5,
            0.0,
            Some(f64::NAN),
            None
        )),
        "deadline"
    );
    add(&mut s, 1, vec![1], p.clone(), 5, 0.0);
    assert_eq!(
        err(s.add_request(RequestId(1), vec![1], p.clone(), 5, 0.0, None, None)),
        "request_id"
    );
    assert_eq!(
        s.add_request(RequestId(2), vec![1], p.clone(), 5, 0.0, None, None),
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

/// Plays the model: the KV value at a slot is a hash of the token and the value at the previous
/// position, read through the row's block table, so it equals `prefix_value(tokens[..=pos])` only
/// if every earlier position was computed from the right tokens into the right slots.
struct ShadowKv {
    slots: Vec<u64>,
    block_size: usize,
}

fn mix(prev: u64, token: i64, pos: i64) -> u64 {
    (prev ^ (token as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .rotate_left(23)
        .wrapping_add(pos as u64 + 1)
}

fn prefix_value(tokens: &[u32]) -> u64 {
    tokens
        .iter()
        .enumerate()
        .fold(0, |v, (p, &t)| mix(v, i64::from(t), p as i64))
}

impl ShadowKv {
    fn run(&mut self, plan: &StepPlan) -> Vec<u64> {
        let bs = self.block_size;
        for c in plan.block_copies.chunks(2) {
            let (src, dst) = (c[0] as usize * bs, c[1] as usize * bs);
            self.slots.copy_within(src..src + bs, dst);
        }
        let mut last = Vec::new();
        for r in 0..plan.num_rows() {
            let table = &plan.block_tables[r * plan.max_num_blocks..(r + 1) * plan.max_num_blocks];
            let slot = |pos: i64| table[pos as usize / bs] as usize * bs + pos as usize % bs;
            for i in plan.cu_seqlens_q[r] as usize..plan.cu_seqlens_q[r + 1] as usize {
                let pos = plan.positions[i];
                assert_eq!(
                    slot(pos) as i64,
                    plan.slot_mapping[i],
                    "slot_mapping agrees with the block table"
                );
                let prev = if pos == 0 {
                    0
                } else {
                    self.slots[slot(pos - 1)]
                };
                self.slots[slot(pos)] = mix(prev, plan.input_ids[i], pos);
            }
            last.push(self.slots[slot(i64::from(plan.context_lens[r]) - 1)]);
        }
        last
    }
}

/// Runs one seeded workload to completion; returns [preemptions, block copies, prefix-hit blocks,
/// aborts, timeouts] so the caller can check that the rules were exercised.
fn random_workload(seed: u64) -> [u64; 5] {
    let mut rng = SmallRng::seed_from_u64(seed);
    let bs = rng.random_range(1..=6);
    let max_model_len = 48;
    let cfg = SchedulerConfig {
        num_blocks: max_model_len / bs + 2 + rng.random_range(0..40),
        block_size: bs,
        max_num_seqs: rng.random_range(1..=8),
        max_num_batched_tokens: rng.random_range(1..=40),
        max_model_len,
        max_num_waiting: 1000,
        enable_prefix_caching: rng.random_bool(0.8),
        priority_aging_s: if rng.random_bool(0.5) { 0.0 } else { 5.0 },
        eos_token_ids: vec![0],
    };
    let mut s = Scheduler::new(cfg.clone()).unwrap();
    let mut kv = ShadowKv {
        slots: vec![0; cfg.num_blocks * bs],
        block_size: bs,
    };
    let prefixes: Vec<Vec<u32>> = (0..3)
        .map(|_| {
            (0..rng.random_range(1..20))
                .map(|_| rng.random_range(1..6))
                .collect()
        })
        .collect();
    let mut next_id = 0u64;
    let mut now = 0.0;
    let mut num_finished = 0;
    let mut seen = [0u64; 5];
    let mut step_no = 0;
    while step_no < 100 || s.has_unfinished_requests() {
        assert!(
            step_no < 20_000,
            "seed {seed}: no progress: {:?}",
            s.stats()
        );
        step_no += 1;
        now += 1.0;
        let adding = step_no < 100;
        for _ in 0..rng.random_range(0..3) {
            if !adding {
                break;
            }
            let mut prompt = prefixes[rng.random_range(0..3)].clone();
            prompt.extend((0..rng.random_range(0..12)).map(|_| rng.random_range(1..6)));
            prompt.truncate(max_model_len - 2);
            let n = if rng.random_bool(0.2) {
                rng.random_range(2..=cfg.max_num_seqs.max(2) as u32)
                    .min(cfg.max_num_seqs as u32)
            } else {
                1
            };
            let max_tokens: i64 = rng.random_range(1..20);
            let p = SamplingParams::new(
                n.into(),
                Some(max_tokens),
                rng.random_range(0..3).min(max_tokens),
                rng.random_bool(0.3),
                vec![],
            )
            .unwrap();
            let deadline = rng
                .random_bool(0.1)
                .then(|| now + rng.random_range(1.0..30.0));
            s.add_request(
                RequestId(next_id),
                prompt,
                Arc::new(p),
                rng.random_range(1..=5),
                now,
                deadline,
                None,
            )
            .unwrap();
            next_id += 1;
        }
        if rng.random_bool(0.05) && next_id > 0 {
            s.abort_request(RequestId(rng.random_range(0..next_id)));
        }
        let before: HashMap<(u64, u32), SeqStatus> = s
            .sequences()
            .iter()
            .map(|v| ((v.req_id.0, v.seq_index), v.status))
            .collect();
        let plan = s.schedule(now);
        s.check_invariants()
            .unwrap_or_else(|e| panic!("seed {seed} step {step_no}: {e}"));
        assert!(plan.num_scheduled_tokens() <= cfg.max_num_batched_tokens);
        assert!(plan.num_rows() <= cfg.max_num_seqs && plan.num_samples() <= cfg.max_num_seqs);
        let views: HashMap<(u64, u32), SeqView> = s
            .sequences()
            .into_iter()
            .map(|v| ((v.req_id.0, v.seq_index), v))
            .collect();
        // Priority order: no waiting sequence outranks one admitted in this step.
        let rank = |v: &SeqView| {
            (
                super::request::effective_priority(
                    v.priority,
                    v.arrival,
                    now,
                    cfg.priority_aging_s,
                ),
                v.arrival,
                v.req_id.0,
                v.seq_index,
            )
        };
        let admitted = views.values().filter(|v| {
            v.status == SeqStatus::Running
                && before.get(&(v.req_id.0, v.seq_index)) != Some(&SeqStatus::Running)
        });
        let best_waiting = views
            .values()
            .filter(|v| v.status != SeqStatus::Running)
            .map(rank)
            .min_by(|a, b| a.partial_cmp(b).unwrap());
        for v in admitted {
            if let Some(w) = best_waiting {
                assert!(
                    rank(v) < w,
                    "seed {seed}: admitted {:?} while a better {:?} waits",
                    rank(v),
                    w
                );
            }
        }
        // The shadow model reads exactly each row's tokens, whatever was reused or copied.
        let last = kv.run(&plan);
        for r in 0..plan.num_rows() {
            let v = &views[&(plan.req_ids[r], plan.seq_indices[r])];
            assert_eq!(
                last[r],
                prefix_value(&v.tokens[..plan.context_lens[r] as usize]),
                "seed {seed} step {step_no} row {r}"
            );
        }
        let sampled: Vec<u32> = (0..plan.num_samples())
            .map(|_| rng.random_range(0..8))
            .collect();
        let out = s.update(plan.step_id, &sampled).unwrap();
        s.check_invariants()
            .unwrap_or_else(|e| panic!("seed {seed} step {step_no} after update: {e}"));
        num_finished += out.finished_req_ids.len() + plan.finished_req_ids.len();
        seen[1] += plan.block_copies.len() as u64 / 2;
        for &r in &plan.finished_reasons {
            seen[if r == FinishReason::Abort as u8 { 3 } else { 4 }] += 1;
        }
    }
    assert!(
        !s.has_unfinished_requests(),
        "seed {seed}: everything drains: {:?} {:?} {:?}",
        s.stats(),
        cfg,
        s.sequences()
            .iter()
            .map(|v| (
                v.status,
                v.tokens.len(),
                v.num_computed_tokens,
                v.block_table.len()
            ))
            .collect::<Vec<_>>()
    );
    assert_eq!(num_finished as u64, next_id);
    assert_eq!(
        s.pool().num_free(),
        cfg.num_blocks - 1,
        "seed {seed}: every block is free at the end"
    );
    seen[0] = s.stats().num_preemptions;
    seen[2] = s.stats().num_prefix_hit_blocks;
    seen
}

#[test]
fn randomized_workloads_keep_every_invariant() {
    let mut total = [0u64; 5];
    for seed in 0..300 {
        for (t, x) in total.iter_mut().zip(random_workload(seed)) {
            *t += x;
        }
    }
    assert!(
        total.iter().all(|&x| x > 0),
        "[preemptions, copies, hits, aborts, timeouts] = {total:?}"
    );
}
