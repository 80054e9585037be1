//! Sampler tests: every processor and filter against the plain implementations in `naive`, then
//! the draw, determinism, errors and logprobs of `sample`.

mod draws;
mod naive;
mod rules;
mod speculative;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::SampleRequest;
use crate::params::SamplingParams;

/// A row of `vocab` logits drawn from a spread-out distribution (seeded).
fn random_row(vocab: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..vocab)
        .map(|_| (rng.random::<f32>() - 0.5) * scale)
        .collect()
}

/// Random token ids below `vocab`.
fn random_ids(len: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..len)
        .map(|_| rng.random_range(0..vocab as u32))
        .collect()
}

fn req<'a>(params: &'a SamplingParams, prompt: &'a [u32], output: &'a [u32]) -> SampleRequest<'a> {
    SampleRequest {
        row: 0,
        params,
        prompt,
        output,
        seed: 0,
        sample_index: 0,
        eos_token_ids: &[],
        allowed: None,
    }
}
