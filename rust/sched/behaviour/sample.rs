//! Plain sampling: every sequence draws one token per step. A request with `n > 1` runs one
//! sequence over its prompt (holding `n` seats), whose last prompt position yields `n` samples;
//! the sequence then forks into `n` that share its blocks (copy-on-write of the partial last
//! block on its next write), one sample each. Sample `j` of the fork draws with sample index
//! `j`, the index its sequence carries from then on, so each child's stream is its own.

use std::ops::Range;

use super::super::core::{Samples, Scheduler};
use super::super::output::StepOutput;
use super::super::rank::SeqKey;
use super::super::seq::Sequence;
use crate::sampling::SampleRequest;
use crate::types::TokenId;
use llguidance::toktrie::SimpleVob;

/// Samples `s`'s row yields at the end of its tokens: one per sequence it forks into.
pub(super) fn samples_at_end(s: &Sequence) -> u32 {
    match s.will_fork() {
        true => s.seats as u32,
        false => 1,
    }
}

/// The sampling requests of `s`'s row, whose samples are `samples` of the plan: a row that
/// forks draws its samples from the parent's history with sample indices `0..n`.
pub(super) fn requests<'a>(
    s: &'a Sequence,
    samples: Range<usize>,
    eos_token_ids: &'a [TokenId],
    allowed: Option<&'a SimpleVob>,
) -> impl Iterator<Item = SampleRequest<'a>> + 'a {
    let forks = samples.len() > 1;
    samples.enumerate().map(move |(j, row)| SampleRequest {
        row,
        params: &s.params,
        prompt: &s.tokens[..s.num_prompt_tokens],
        output: &s.tokens[s.num_prompt_tokens..],
        seed: s.seed,
        sample_index: if forks { j as u32 } else { s.seq_index },
        eos_token_ids,
        allowed,
    })
}

impl Scheduler {
    /// Applies `key`'s samples: forks the sequence when it yields several, then appends one
    /// token to each sequence.
    pub(super) fn apply_samples(
        &mut self,
        key: SeqKey,
        samples: Range<usize>,
        drawn: &Samples<'_>,
        out: &mut StepOutput,
    ) {
        if samples.len() == 1 {
            return self.append(
                key,
                drawn.token(samples.start),
                drawn.drawn(samples.start),
                out,
            );
        }
        let mut keys = vec![key];
        self.fork(key, samples.len(), &mut keys);
        for (i, &key) in samples.zip(&keys) {
            self.append(key, drawn.token(i), drawn.drawn(i), out);
        }
    }
}
