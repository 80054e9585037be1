//! The logprob byte columns: each logprob entry's token bytes arrive in the step that made it.

use std::sync::Arc;

use super::*;
use crate::detok::{fixtures, Detokenizer};
use crate::params::SamplingParams;

#[test]
fn logprob_entries_carry_their_token_bytes() {
    let json = fixtures::byte_level().to_string(false).expect("serializes");
    let detok = Arc::new(Detokenizer::from_json(&json).expect("loads"));
    let vocab = 300;
    let mut s = Scheduler::new(cfg(32, 4, 64, 8)).unwrap();
    s.set_detokenizer(Some(detok.clone()));
    let with = |logprobs| {
        Arc::new(SamplingParams {
            temperature: 0.0,
            max_tokens: Some(4),
            logprobs,
            ..SamplingParams::default()
        })
    };
    add(&mut s, 1, vec![70, 71], with(Some(2)), 5, 0.0);
    add(&mut s, 2, vec![72], with(None), 5, 0.0);
    let plan = s.schedule(0.0);
    let mut logits = vec![0.0f32; 2 * vocab];
    for (row, best) in logits.chunks_mut(vocab).zip([[80, 81, 82], [90, 91, 92]]) {
        for (rank, t) in best.into_iter().enumerate() {
            row[t] = 3.0 - rank as f32;
        }
    }
    let out = s.update_with_logits(plan.step_id, &logits, vocab).unwrap();
    let width = out.num_top_logprobs;
    assert_eq!(width, 2);
    assert_eq!(out.logprob_byte_offsets.len(), 2 * (1 + width) + 1);
    let entry = |i: usize| {
        let o = &out.logprob_byte_offsets;
        &out.logprob_bytes[o[i] as usize..o[i + 1] as usize]
    };
    // Sample 0 asked for logprobs: the chosen token 80, then the alternatives 80 and 81.
    for (i, token) in [80, 80, 81].into_iter().enumerate() {
        assert!(!entry(i).is_empty());
        assert_eq!(entry(i), &detok.token_bytes(token)[..], "entry {i}");
    }
    // Sample 1 asked for none: its entries are empty.
    assert!((3..6).all(|i| entry(i).is_empty()));
}
