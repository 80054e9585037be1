//! Criterion benches of the scheduler alone: a steady-decode step (schedule + update) at 64, 256
//! and 1024 running sequences, and admission of 2k-token prompts with 0%, 50% and 90% prefix hits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use _core::{NewRequest, SamplingParams, Scheduler, SchedulerConfig};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const PROMPT_LEN: usize = 256;
/// Decode steps run on one scheduler before it is rebuilt (contexts grow 256 -> 768 tokens).
const STEPS_PER_STATE: u64 = 512;

/// A scheduler with `num_seqs` requests of 256-token prompts, all past prefill.
fn decoding(num_seqs: usize) -> Scheduler {
    let cfg = SchedulerConfig {
        num_blocks: num_seqs * (PROMPT_LEN + STEPS_PER_STATE as usize + 16) / 16 + 1,
        block_size: 16,
        max_num_seqs: num_seqs,
        max_num_batched_tokens: 1 << 20,
        max_model_len: 4096,
        max_num_waiting: num_seqs,
        enable_prefix_caching: true,
        priority_aging_s: 10.0,
        eos_token_ids: vec![0],
        ..SchedulerConfig::default()
    };
    let mut s = Scheduler::new(cfg).unwrap();
    let params = Arc::new(SamplingParams::new(1, None, 0, true, vec![]).unwrap());
    for i in 0..num_seqs {
        let prompt: Vec<u32> = (0..PROMPT_LEN as u32)
            .map(|t| 1 + (t * 7 + i as u32) % 30000)
            .collect();
        s.add_request(NewRequest::new(i as u64, prompt, params.clone()))
            .unwrap();
    }
    let plan = s.schedule(0.0);
    s.update(plan.step_id, &vec![1; plan.num_samples()])
        .unwrap();
    s
}

fn steady_decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("steady_decode_step");
    for num_seqs in [64usize, 256, 1024] {
        group.throughput(Throughput::Elements(num_seqs as u64));
        group.bench_with_input(BenchmarkId::from_parameter(num_seqs), &num_seqs, |b, &n| {
            let sampled = vec![1u32; n];
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut done = 0;
                while done < iters {
                    let mut s = decoding(n);
                    let steps = (iters - done).min(STEPS_PER_STATE);
                    let start = Instant::now();
                    for _ in 0..steps {
                        let plan = s.schedule(1.0);
                        std::hint::black_box(s.update(plan.step_id, &sampled).unwrap());
                    }
                    total += start.elapsed();
                    done += steps;
                }
                total
            });
        });
    }
    group.finish();
}

fn admission(c: &mut Criterion) {
    const LEN: usize = 2048;
    const BATCH: usize = 4;
    let mut group = c.benchmark_group("admit_2k_prompts_x4");
    group.throughput(Throughput::Elements(BATCH as u64));
    for hit_pct in [0usize, 50, 90] {
        group.bench_with_input(
            BenchmarkId::new("prefix_hit_pct", hit_pct),
            &hit_pct,
            |b, &pct| {
                let cfg = SchedulerConfig {
                    num_blocks: 2048,
                    max_num_batched_tokens: BATCH * LEN,
                    ..SchedulerConfig::default()
                };
                let mut s = Scheduler::new(cfg).unwrap();
                let params = Arc::new(SamplingParams::new(1, Some(1), 0, true, vec![]).unwrap());
                let shared: Vec<u32> = (0..(LEN * pct / 100) as u32)
                    .map(|t| 1 + t % 1000)
                    .collect();
                let mut next = 0u64;
                let mut run = |s: &mut Scheduler, timed: bool| -> Duration {
                    for _ in 0..BATCH {
                        let mut prompt = shared.clone();
                        prompt.extend(
                            (prompt.len()..LEN)
                                .map(|t| 1 + ((t as u64 * 31 + next * 7919) % 30000) as u32),
                        );
                        s.add_request(NewRequest::new(next, prompt, params.clone()))
                            .unwrap();
                        next += 1;
                    }
                    let start = Instant::now();
                    let plan = s.schedule(0.0);
                    let out = s
                        .update(plan.step_id, &vec![1; plan.num_samples()])
                        .unwrap();
                    let elapsed = start.elapsed();
                    assert!(!timed || out.finished_req_ids.len() == BATCH);
                    elapsed
                };
                run(&mut s, false); // warm the cache with the shared prefix
                b.iter_custom(|iters| (0..iters).map(|_| run(&mut s, true)).sum());
            },
        );
    }
    group.finish();
}

criterion_group!(benches, steady_decode, admission);
criterion_main!(benches);
