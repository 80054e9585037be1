//! Speculative decoding in the scheduler: the plan's draft columns, acceptance and rollback,
//! ends inside an accepted run, and outputs identical to decoding without a draft under a toy
//! model whose logits depend on the whole history.

use std::sync::Arc;

use super::*;
use crate::params::SamplingParams;

const VOCAB: usize = 16;

fn spec_cfg(speculative: Option<NgramConfig>) -> SchedulerConfig {
    SchedulerConfig {
        speculative,
        vocab_size: VOCAB,
        ..cfg(64, 4, 64, 4)
    }
}

fn greedy(max_tokens: u32) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..(*params(1, max_tokens)).clone()
    }
}

fn with_draft(id: u64, prompt: Vec<u32>, p: SamplingParams, draft: Vec<u32>) -> NewRequest {
    NewRequest {
        draft_tokens: draft,
        ..NewRequest::new(id, prompt, Arc::new(p))
    }
}

/// The toy model's logits after `history`: a pseudo-random row keyed by the whole history,
/// so that a token computed from the wrong context shows.
fn toy_logits(history: &[u32]) -> Vec<f32> {
    let mut h = history.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| {
        (h ^ u64::from(t)).wrapping_mul(0x100_0000_01b3)
    });
    (0..VOCAB)
        .map(|_| {
            h = h
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((h >> 40) as f32 / (1u64 << 24) as f32) * 4.0
        })
        .collect()
}

/// Logits for every sample of `plan`: each from the history its position sees (the sequence's
/// tokens up to the row's own tokens, then the row's draft tokens before that position).
fn plan_logits(s: &Scheduler, plan: &StepPlan) -> Vec<f32> {
    let views = s.sequences();
    let mut logits = Vec::new();
    for (&idx, &row) in plan.logits_indices.iter().zip(&plan.sample_rows) {
        let r = row as usize;
        let v = views
            .iter()
            .find(|v| v.req_id.0 == plan.req_ids[r] && v.seq_index == plan.seq_indices[r])
            .unwrap();
        let start = plan.cu_seqlens_q[r] as usize;
        let pos = plan.positions[idx as usize] as usize;
        let first_pos = plan.positions[start] as usize;
        let mut history = v.tokens[..first_pos].to_vec();
        history.extend(
            plan.input_ids[start..=idx as usize]
                .iter()
                .map(|&t| t as u32),
        );
        assert_eq!(history.len(), pos + 1);
        logits.extend(toy_logits(&history));
    }
    logits
}

/// Runs everything to completion under the toy model: (outputs by request, steps taken).
fn run(s: &mut Scheduler) -> (Vec<(u64, Vec<u32>, u8)>, usize) {
    let mut outputs: Vec<(u64, Vec<u32>, u8)> = Vec::new();
    let mut steps = 0;
    while s.has_unfinished_requests() {
        steps += 1;
        let plan = s.schedule(steps as f64);
        s.check_invariants().unwrap();
        let logits = plan_logits(s, &plan);
        let out = s.update_with_logits(plan.step_id, &logits, VOCAB).unwrap();
        s.check_invariants().unwrap();
        assert!(out.failed_req_ids.is_empty(), "{:?}", out.failed_messages());
        for i in 0..out.num_samples() {
            let id = out.req_ids[i];
            let entry = match outputs.iter_mut().position(|o| o.0 == id) {
                Some(j) => &mut outputs[j],
                None => {
                    outputs.push((id, Vec::new(), 0));
                    outputs.last_mut().unwrap()
                }
            };
            entry.1.push(out.token_ids[i]);
            entry.2 = out.finish_reasons[i];
        }
    }
    assert_eq!(s.pool().num_free(), s.config().num_blocks - 1);
    outputs.sort();
    (outputs, steps)
}

fn run_one(cfg: SchedulerConfig, req: NewRequest) -> (Vec<u32>, usize, SchedulerStats) {
    let mut s = Scheduler::new(cfg).unwrap();
    s.add_request(req).unwrap();
    let (mut out, steps) = run(&mut s);
    (out.pop().unwrap().1, steps, s.stats())
}

#[test]
fn a_draft_row_computes_its_draft_and_samples_every_position() {
    let mut s = Scheduler::new(spec_cfg(None)).unwrap();
    s.add_request(with_draft(1, vec![1, 2, 3], greedy(10), vec![5, 6, 7, 8]))
        .unwrap();
    // The prompt's row carries the draft: it is verified in the prompt's own step.
    let plan = s.schedule(0.0);
    assert_eq!(plan.input_ids, vec![1, 2, 3, 5, 6, 7, 8]);
    assert_eq!(plan.positions, vec![0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(plan.num_draft_tokens, vec![4]);
    assert_eq!(plan.context_lens, vec![7]);
    assert_eq!(plan.logits_indices, vec![2, 3, 4, 5, 6]);
    assert_eq!(plan.sample_rows, vec![0; 5]);
    // The target agrees with 5 and 6, then says 9: three tokens in one step.
    let out = s.update(plan.step_id, &[5, 6, 9, 4, 4]).unwrap();
    assert_eq!(out.token_ids, vec![5, 6, 9]);
    s.check_invariants().unwrap();
    let v = &s.sequences()[0];
    assert_eq!(v.tokens, vec![1, 2, 3, 5, 6, 9]);
    assert_eq!(
        v.num_computed_tokens, 5,
        "the rejected 7's KV is not committed"
    );
    assert_eq!(v.block_table.len(), 2);
    assert_eq!(s.stats().num_draft_tokens, 4);
    assert_eq!(s.stats().num_accepted_draft_tokens, 2);
    // The output left the draft: it is used up; a decode row is one token again.
    let plan = s.schedule(1.0);
    assert_eq!(plan.num_draft_tokens, vec![0]);
    assert_eq!(plan.input_ids, vec![9]);
    assert_eq!(plan.num_decode_tokens, 1);
}

#[test]
fn a_decode_row_carries_the_rest_of_a_draft_the_output_follows() {
    // A budget of 4 computes the prompt alone first; the draft then rides the decode row,
    // minus the token the prompt's step produced.
    let mut s = Scheduler::new(SchedulerConfig {
        max_num_batched_tokens: 4,
        ..spec_cfg(None)
    })
    .unwrap();
    s.add_request(with_draft(
        1,
        vec![1, 2, 3, 4],
        greedy(10),
        vec![5, 6, 7, 8],
    ))
    .unwrap();
    let (plan, _) = step(&mut s, 0.0, 5);
    assert_eq!(plan.num_draft_tokens, vec![0]);
    let plan = s.schedule(1.0);
    assert_eq!(plan.input_ids, vec![5, 6, 7, 8]);
    assert_eq!(plan.positions, vec![4, 5, 6, 7]);
    assert_eq!(plan.num_draft_tokens, vec![3]);
    assert_eq!(plan.num_decode_tokens, 0);
    let out = s.update(plan.step_id, &[6, 7, 8, 2]).unwrap();
    assert_eq!(
        out.token_ids,
        vec![6, 7, 8, 2],
        "all accepted, plus the bonus token"
    );
    s.check_invariants().unwrap();
    assert_eq!(s.sequences()[0].num_computed_tokens, 8);
}

#[test]
fn rejected_positions_give_their_blocks_back() {
    let mut s = Scheduler::new(spec_cfg(None)).unwrap();
    s.add_request(with_draft(
        1,
        vec![1, 2, 3],
        greedy(20),
        vec![5, 6, 7, 8, 9, 10, 11, 12],
    ))
    .unwrap();
    let free_before = s.pool().num_free();
    let plan = s.schedule(1.0);
    assert_eq!(plan.num_draft_tokens, vec![8]);
    // Positions 0..=10 take blocks 0..=2 (block size 4).
    assert_eq!(s.pool().num_free(), free_before - 3);
    let mut sampled = vec![0u32; 9];
    sampled[0] = 13; // the first draft token is rejected
    let out = s.update(plan.step_id, &sampled).unwrap();
    assert_eq!(out.token_ids, vec![13]);
    s.check_invariants().unwrap();
    assert_eq!(
        s.pool().num_free(),
        free_before - 1,
        "only the prompt's block is held"
    );
    assert_eq!(s.sequences()[0].num_computed_tokens, 3);
}

#[test]
fn a_stop_inside_an_accepted_run_ends_the_sequence_there() {
    // EOS (0) is the second draft token: the sequence ends on it, and nothing after it counts.
    let mut s = Scheduler::new(spec_cfg(None)).unwrap();
    s.add_request(with_draft(1, vec![1, 2, 3], greedy(20), vec![6, 0, 7]))
        .unwrap();
    let plan = s.schedule(1.0);
    let out = s.update(plan.step_id, &[6, 0, 7, 8]).unwrap();
    assert_eq!(out.token_ids, vec![6, 0]);
    assert_eq!(out.finish_reasons, vec![0, FinishReason::Stop as u8]);
    assert_eq!(out.finished_req_ids, vec![1]);
    s.check_invariants().unwrap();
    assert_eq!(s.pool().num_free(), s.config().num_blocks - 1);
}

#[test]
fn a_draft_never_runs_past_max_tokens_or_the_budget() {
    // max_tokens 2: the draft may hold 1 (plus the bonus token).
    let mut s = Scheduler::new(spec_cfg(None)).unwrap();
    s.add_request(with_draft(1, vec![1, 2, 3], greedy(2), vec![5, 6, 7, 8]))
        .unwrap();
    let plan = s.schedule(0.0);
    assert_eq!(plan.num_draft_tokens, vec![1]);
    let out = s.update(plan.step_id, &[5, 7]).unwrap();
    assert_eq!(out.token_ids, vec![5, 7]);
    assert_eq!(out.finish_reasons[1], FinishReason::Length as u8);
    // A budget of 4 after a 2-token prompt leaves room for 2 draft tokens.
    let mut s = Scheduler::new(SchedulerConfig {
        max_num_batched_tokens: 4,
        ..spec_cfg(None)
    })
    .unwrap();
    s.add_request(with_draft(1, vec![1, 2], greedy(20), vec![5, 6, 7, 8]))
        .unwrap();
    assert_eq!(s.schedule(0.0).num_draft_tokens, vec![2]);
}

#[test]
fn drafts_are_refused_where_they_cannot_be_verified() {
    let mut s = Scheduler::new(spec_cfg(None)).unwrap();
    let beam = SamplingParams {
        use_beam_search: true,
        best_of: 2,
        ..greedy(4)
    };
    let err = s
        .add_request(with_draft(1, vec![1, 2], beam, vec![3]))
        .unwrap_err();
    assert!(matches!(&err, CoreError::Invalid { param, .. } if param == "draft_tokens"));
    let err = s
        .add_request(with_draft(2, vec![1, 2], greedy(4), vec![VOCAB as u32]))
        .unwrap_err();
    assert!(matches!(&err, CoreError::Invalid { param, .. } if param == "draft_tokens"));
    let err = s
        .add_request(NewRequest {
            draft_logits: Some(vec![0.0; VOCAB + 1]),
            ..with_draft(3, vec![1, 2], greedy(4), vec![3])
        })
        .unwrap_err();
    assert!(matches!(&err, CoreError::Invalid { param, .. } if param == "draft_logits"));
}

#[test]
fn greedy_output_is_the_same_with_a_correct_a_garbage_or_no_draft() {
    let prompt = vec![3, 1, 4, 1, 5, 9, 2, 6];
    let (plain, plain_steps, _) = run_one(
        spec_cfg(None),
        with_draft(1, prompt.clone(), greedy(12), vec![]),
    );
    assert!(plain.len() > 4, "{plain:?}");
    let (correct, correct_steps, stats) = run_one(
        spec_cfg(None),
        with_draft(1, prompt.clone(), greedy(12), plain.clone()),
    );
    assert_eq!(correct, plain);
    assert!(
        correct_steps < plain_steps,
        "{correct_steps} vs {plain_steps}"
    );
    assert_eq!(stats.num_accepted_draft_tokens, stats.num_draft_tokens);
    let garbage: Vec<u32> = plain.iter().map(|&t| (t + 1) % VOCAB as u32).collect();
    // Wrong from the start, or right at first and wrong after: the output leaves the draft.
    let mut wrong_after_first = plain.clone();
    for t in &mut wrong_after_first[1..] {
        *t = (*t + 3) % VOCAB as u32;
    }
    for draft in [garbage, wrong_after_first] {
        let (out, _, _) = run_one(
            spec_cfg(None),
            with_draft(1, prompt.clone(), greedy(12), draft),
        );
        assert_eq!(out, plain);
    }
}

/// Many requests at once, greedy and seeded sampled ones, with the n-gram drafter on and off.
fn mixed_batch(s: &mut Scheduler) {
    for id in 0..12u64 {
        // Repetitive prompts so that the n-gram drafter finds matches.
        let base: Vec<u32> = (0..4 + id as u32 % 3)
            .map(|t| (t * 3 + id as u32) % 7 + 1)
            .collect();
        let prompt: Vec<u32> = base
            .iter()
            .cycle()
            .take(10 + id as usize)
            .copied()
            .collect();
        let p = SamplingParams {
            temperature: if id % 2 == 0 { 0.0 } else { 0.8 },
            top_p: if id % 3 == 0 { 0.9 } else { 1.0 },
            repetition_penalty: if id % 4 == 1 { 1.3 } else { 1.0 },
            seed: Some(id),
            n: if id == 5 { 2 } else { 1 },
            ..(*params(1, 10 + id as u32)).clone()
        };
        s.add_request(NewRequest::new(id, prompt, Arc::new(p)))
            .unwrap();
    }
}

#[test]
fn ngram_speculation_gives_the_same_outputs_greedy_and_seeded() {
    let mut plain = Scheduler::new(spec_cfg(None)).unwrap();
    mixed_batch(&mut plain);
    let (want, plain_steps) = run(&mut plain);
    for ngram in [
        NgramConfig::default(),
        NgramConfig {
            min_n: 2,
            max_n: 4,
            num_draft_tokens: 2,
        },
    ] {
        let mut spec = Scheduler::new(spec_cfg(Some(ngram))).unwrap();
        mixed_batch(&mut spec);
        let (got, steps) = run(&mut spec);
        assert_eq!(got, want);
        let stats = spec.stats();
        assert!(stats.num_accepted_draft_tokens > 0, "{stats:?}");
        assert!(
            stats.num_accepted_draft_tokens < stats.num_draft_tokens,
            "{stats:?}"
        );
        assert!(steps <= plain_steps, "{steps} vs {plain_steps}");
    }
}
