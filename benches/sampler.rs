//! Criterion benches of `sampling::sample` alone: rows 1/64/256 x vocab 49152/151936, with
//! top-k 50 + top-p 0.9 + temperature 0.8 + repetition 1.1 + presence 0.5 + frequency 0.5 over
//! 256-token prompts and 256-token outputs ("filtered"), and greedy with the same penalties.

use _core::sampling::{sample, SampleRequest, SamplerConfig};
use _core::SamplingParams;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const HISTORY: usize = 256;

/// Logits with a realistic spread (a few standard deviations) in a fixed random order.
fn logits(rows: usize, vocab: usize) -> Vec<f32> {
    let mut rng = SmallRng::seed_from_u64(1);
    (0..rows * vocab)
        .map(|_| {
            let (a, b): (f32, f32) = (rng.random(), rng.random());
            (a + b - 1.0) * 6.0
        })
        .collect()
}

fn histories(rows: usize, vocab: usize) -> Vec<Vec<u32>> {
    let mut rng = SmallRng::seed_from_u64(2);
    (0..2 * rows)
        .map(|_| {
            (0..HISTORY)
                .map(|_| rng.random_range(0..vocab as u32))
                .collect()
        })
        .collect()
}

fn params(greedy: bool) -> SamplingParams {
    SamplingParams {
        temperature: if greedy { 0.0 } else { 0.8 },
        top_k: if greedy { 0 } else { 50 },
        top_p: if greedy { 1.0 } else { 0.9 },
        repetition_penalty: 1.1,
        presence_penalty: 0.5,
        frequency_penalty: 0.5,
        ..SamplingParams::default()
    }
}

fn bench_sample(c: &mut Criterion) {
    let mut group = c.benchmark_group("sampler");
    for vocab in [49_152usize, 151_936] {
        for rows in [1usize, 64, 256] {
            let logits = logits(rows, vocab);
            let hist = histories(rows, vocab);
            for (name, greedy) in [("filtered", false), ("greedy", true)] {
                let p = params(greedy);
                let reqs: Vec<SampleRequest<'_>> = (0..rows)
                    .map(|r| SampleRequest {
                        row: r,
                        params: &p,
                        prompt: &hist[2 * r],
                        output: &hist[2 * r + 1],
                        seed: r as u64,
                        sample_index: 0,
                        eos_token_ids: &[0],
                        allowed: None,
                    })
                    .collect();
                let cfg = SamplerConfig::default();
                group.throughput(Throughput::Elements(rows as u64));
                let id = BenchmarkId::new(name, format!("rows={rows}/vocab={vocab}"));
                group.bench_function(id, |b| {
                    b.iter(|| sample(&logits, vocab, &reqs, &cfg).unwrap())
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench_sample);
criterion_main!(benches);
