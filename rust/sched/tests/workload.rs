//! Seeded randomized workloads checked against the invariants and a shadow KV cache that plays
//! the model runner.

use std::collections::HashMap;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::sched::MediaSpan;

/// Plays the model: the KV value at a slot is a hash of the token and the value at the previous
/// position, read through the row's block table, so it equals `prefix_value(tokens[..=pos])` only
/// if every earlier position was computed from the right tokens into the right slots. A media
/// position's "token" is its item's digest (`seen_as`): the placeholder tokens alone do not say
/// which image a block holds.
struct ShadowKv {
    slots: Vec<u64>,
    block_size: usize,
}

fn mix(prev: u64, token: i64, pos: i64) -> u64 {
    (prev ^ (token as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .rotate_left(23)
        .wrapping_add(pos as u64 + 1)
}

fn prefix_value(tokens: &[u32], spans: &[MediaSpan]) -> u64 {
    tokens.iter().enumerate().fold(0, |v, (p, &t)| {
        mix(v, seen_as(i64::from(t), p, spans), p as i64)
    })
}

/// Placeholder token of media positions in the randomized workloads.
const IMG: u32 = 7;
/// Digests the workloads' media items draw from.
const DIGESTS: [&str; 2] = ["image:a", "image:b"];

/// What the model sees at `pos`: the token, or within a media span its item's digest.
fn seen_as(token: i64, pos: usize, spans: &[MediaSpan]) -> i64 {
    match spans.iter().position(|s| s.offset <= pos && pos < s.end()) {
        Some(i) => {
            1000 + DIGESTS
                .iter()
                .position(|&d| *d == *spans[i].digest)
                .unwrap() as i64
        }
        None => token,
    }
}

impl ShadowKv {
    fn run(&mut self, plan: &StepPlan, media: &HashMap<u64, Vec<MediaSpan>>) -> Vec<u64> {
        let bs = self.block_size;
        for c in plan.block_copies.chunks(2) {
            let (src, dst) = (c[0] as usize * bs, c[1] as usize * bs);
            self.slots.copy_within(src..src + bs, dst);
        }
        let mut last = Vec::new();
        for r in 0..plan.num_rows() {
            let spans = media.get(&plan.req_ids[r]).map_or(&[][..], |m| &m[..]);
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
                let token = seen_as(plan.input_ids[i], pos as usize, spans);
                self.slots[slot(pos)] = mix(prev, token, pos);
            }
            last.push(self.slots[slot(i64::from(plan.context_lens[r]) - 1)]);
        }
        last
    }
}

const VOCAB: usize = 8;

/// Every emitted beam hypothesis is whole and ranked: sequence indices `0..k` with `k <= n`,
/// each one contiguous run of entries ending with its finish reason and its score, the scores
/// non-increasing by index. Returns the beam requests that emitted.
fn check_beam_outputs(out: &StepOutput, beam_n: &HashMap<u64, u32>, seed: u64) -> usize {
    let mut emitted = 0;
    let mut i = 0;
    while i < out.num_samples() {
        let req = out.req_ids[i];
        let Some(&n) = beam_n.get(&req) else {
            i += 1;
            continue;
        };
        emitted += 1;
        let mut scores = Vec::new();
        while i < out.num_samples() && out.req_ids[i] == req {
            let index = out.seq_indices[i];
            assert_eq!(
                index as usize,
                scores.len(),
                "seed {seed}: hypotheses in order"
            );
            while out.sequence_scores[i].is_nan() {
                assert_eq!(
                    out.finish_reasons[i], 0,
                    "seed {seed}: only the last token ends"
                );
                i += 1;
                assert_eq!(
                    out.seq_indices[i], index,
                    "seed {seed}: one run per hypothesis"
                );
            }
            assert_ne!(
                out.finish_reasons[i], 0,
                "seed {seed}: the scored token ends it"
            );
            scores.push(out.sequence_scores[i]);
            i += 1;
        }
        assert!(
            scores.len() <= n as usize && !scores.is_empty(),
            "seed {seed}"
        );
        assert!(
            scores.windows(2).all(|w| w[0] >= w[1]),
            "seed {seed}: best first: {scores:?}"
        );
    }
    emitted
}

/// Runs one seeded workload to completion; returns [preemptions, block copies, prefix-hit blocks,
/// aborts, timeouts, beam groups that emitted, beams preempted, draft tokens accepted, draft
/// tokens rejected] so the caller can check that the rules were exercised.
fn random_workload(seed: u64) -> [u64; 9] {
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
        seed: Some(seed),
        speculative: rng.random_bool(0.5).then(|| {
            let min_n = rng.random_range(1..=2);
            NgramConfig {
                min_n,
                max_n: rng.random_range(min_n..=3),
                num_draft_tokens: rng.random_range(1..=5),
            }
        }),
        max_num_encoder_tokens: rng.random_range(1..=12),
        ..SchedulerConfig::default()
    };
    let mut s = Scheduler::new(cfg.clone()).unwrap();
    let mut media: HashMap<u64, Vec<MediaSpan>> = HashMap::new();
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
    let mut seen = [0u64; 9];
    let mut step_no = 0;
    let mut beam_n: HashMap<u64, u32> = HashMap::new();
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
            let shared = prompt.len();
            prompt.extend((0..rng.random_range(0..12)).map(|_| rng.random_range(1..6)));
            prompt.truncate(max_model_len - 2);
            let n = if rng.random_bool(0.2) {
                rng.random_range(2..=cfg.max_num_seqs.max(2) as u32)
                    .min(cfg.max_num_seqs as u32)
            } else {
                1
            };
            let max_tokens: i64 = rng.random_range(1..20);
            let mut p = SamplingParams::new(
                n.into(),
                Some(max_tokens),
                rng.random_range(0..3).min(max_tokens),
                rng.random_bool(0.3),
                vec![],
            )
            .unwrap();
            let beam = rng.random_bool(0.15);
            if beam {
                let width = rng.random_range(1..=cfg.max_num_seqs.min(5) as u32);
                p = SamplingParams {
                    use_beam_search: true,
                    best_of: width,
                    n: rng.random_range(1..=width),
                    length_penalty: [0.5, 1.0, 2.0][rng.random_range(0..3)],
                    early_stopping: [
                        EarlyStopping::Heuristic,
                        EarlyStopping::Finished,
                        EarlyStopping::Never,
                    ][rng.random_range(0..3)],
                    logprobs: rng.random_bool(0.3).then_some(2),
                    ..p
                };
            }
            let p_n = p.n;
            let deadline = rng
                .random_bool(0.1)
                .then(|| now + rng.random_range(1.0..30.0));
            // A client's draft of the output's first tokens, sometimes with the drafter's logits.
            let draft_tokens: Vec<u32> = match !beam && rng.random_bool(0.3) {
                true => (0..rng.random_range(1..8))
                    .map(|_| rng.random_range(0..VOCAB as u32))
                    .collect(),
                false => Vec::new(),
            };
            let draft_logits = (!draft_tokens.is_empty() && rng.random_bool(0.5)).then(|| {
                (0..draft_tokens.len() * VOCAB)
                    .map(|_| rng.random_range(-3.0..3.0))
                    .collect()
            });
            // An image after the shared prefix (or anywhere), one of two, 1..8 positions.
            let spans = match !beam && rng.random_bool(0.4) {
                true => random_image(&mut rng, &mut prompt, shared),
                false => Vec::new(),
            };
            let added = s.add_request(NewRequest {
                deadline,
                draft_tokens,
                draft_logits,
                media: spans.clone(),
                ..req(next_id, prompt, Arc::new(p), rng.random_range(1..=5), now)
            });
            match added {
                Ok(()) => {
                    media.insert(next_id, spans);
                    if beam {
                        beam_n.insert(next_id, p_n);
                    }
                    next_id += 1;
                }
                // A beam group the whole pool could not hold is refused up front.
                Err(CoreError::Invalid { param, .. }) if beam && param == "best_of" => {}
                Err(e) => panic!("seed {seed}: {e}"),
            }
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
        // The step's first image may be longer than the budget; after it nothing else starts.
        assert!(
            plan.num_encoder_tokens <= cfg.max_num_encoder_tokens.max(8),
            "seed {seed} step {step_no}: {} > {}; rows {:?} preempted {:?} gangs {:?}",
            plan.num_encoder_tokens,
            cfg.max_num_encoder_tokens,
            plan.req_ids,
            plan.preempted_req_ids,
            plan.req_ids
                .iter()
                .map(|r| (beam_n.contains_key(r), media[r].clone()))
                .collect::<Vec<_>>()
        );
        let num_draft: usize = plan.num_draft_tokens.iter().map(|&k| k as usize).sum();
        assert!(
            plan.num_rows() <= cfg.max_num_seqs
                && plan.num_samples() <= cfg.max_num_seqs + num_draft
        );
        let views: HashMap<(u64, u32), SeqView> = s
            .sequences()
            .into_iter()
            .map(|v| ((v.req_id.0, v.seq_index), v))
            .collect();
        // Priority order: no waiting sequence outranks one admitted in this step.
        let rank = |v: &SeqView| {
            (
                crate::sched::rank::effective_priority(
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
        let last = kv.run(&plan, &media);
        // A row with draft tokens computes them after its own tokens.
        for r in 0..plan.num_rows() {
            let v = &views[&(plan.req_ids[r], plan.seq_indices[r])];
            let num_draft = plan.num_draft_tokens[r] as usize;
            let row_end = plan.cu_seqlens_q[r + 1] as usize;
            let draft = plan.input_ids[row_end - num_draft..row_end]
                .iter()
                .map(|&t| t as u32);
            let context_len = plan.context_lens[r] as usize - num_draft;
            let tokens: Vec<u32> = v.tokens[..context_len]
                .iter()
                .copied()
                .chain(draft)
                .collect();
            assert_eq!(
                last[r],
                prefix_value(&tokens, &media[&plan.req_ids[r]]),
                "seed {seed} step {step_no} row {r}"
            );
        }
        // Random logits over a vocabulary of 8: sampled rows draw from them, beam groups
        // choose their continuations from them.
        let logits: Vec<f32> = (0..plan.num_samples() * VOCAB)
            .map(|_| rng.random_range(-3.0..3.0))
            .collect();
        let out = s.update_with_logits(plan.step_id, &logits, VOCAB).unwrap();
        assert!(
            out.failed_req_ids.is_empty(),
            "seed {seed}: {:?}",
            out.failed_messages()
        );
        seen[5] += check_beam_outputs(&out, &beam_n, seed) as u64;
        s.check_invariants()
            .unwrap_or_else(|e| panic!("seed {seed} step {step_no} after update: {e}"));
        num_finished += out.finished_req_ids.len() + plan.finished_req_ids.len();
        seen[1] += plan.block_copies.len() as u64 / 2;
        seen[6] += plan
            .preempted_req_ids
            .iter()
            .filter(|r| beam_n.contains_key(r))
            .count() as u64;
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
    let stats = s.stats();
    seen[0] = stats.num_preemptions;
    seen[2] = stats.num_prefix_hit_blocks;
    seen[7] = stats.num_accepted_draft_tokens;
    seen[8] = stats.num_draft_tokens - stats.num_accepted_draft_tokens;
    seen
}

/// Turns 1..8 positions of `prompt` into an image (after its first `shared` tokens, mostly,
/// so that requests on one prefix share the text before it).
fn random_image(rng: &mut SmallRng, prompt: &mut [u32], shared: usize) -> Vec<MediaSpan> {
    let offset = match rng.random_bool(0.7) && shared < prompt.len() {
        true => shared,
        false => rng.random_range(0..prompt.len()),
    };
    let length = rng.random_range(1..=8.min(prompt.len() - offset));
    prompt[offset..offset + length].fill(IMG);
    let digest = DIGESTS[rng.random_range(0..DIGESTS.len())];
    vec![MediaSpan {
        offset,
        length,
        digest: digest.into(),
    }]
}

#[test]
fn randomized_workloads_keep_every_invariant() {
    let mut total = [0u64; 9];
    for seed in 0..300 {
        for (t, x) in total.iter_mut().zip(random_workload(seed)) {
            *t += x;
        }
    }
    assert!(
        total.iter().all(|&x| x > 0),
        "[preemptions, copies, hits, aborts, timeouts, beam groups that emitted, beams preempted, drafts accepted, drafts rejected] = {total:?}"
    );
}
