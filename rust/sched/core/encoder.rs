//! The encoder budget: each step starts the encoder work of at most `max_num_encoder_tokens`
//! media positions. A span counts in the step whose prefill chunk first reaches into it (the
//! model runner encodes it then and caches the output for the span's later chunks). A chunk that
//! would reach into a span the rest of the budget cannot cover is cut to end before the span's
//! offset; if nothing is left, the sequence waits for the next step. The first span a step
//! starts is never cut, however long, so a span longer than the whole budget still runs (alone).
//!
//! A sequence counts a span again after it is admitted anew (preemption by recompute): the
//! runner's encoder cache may still hold the output, but the scheduler cannot know, and
//! counting it again only delays work, never overruns the budget. A row dropped from its step
//! (its sequence preempted) gives back what it spent.

use super::Scheduler;
use crate::sched::media::num_spans_done;
use crate::sched::rank::SeqKey;

/// One step's encoder budget and what the step's rows have started of it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EncoderBudget {
    /// Encoder tokens a step may start (`max_num_encoder_tokens`).
    pub max: usize,
    /// Encoder tokens the step's rows start so far.
    pub num_scheduled: usize,
}

impl EncoderBudget {
    /// A fresh step's budget of `max_num_encoder_tokens`.
    pub fn new(max_num_encoder_tokens: usize) -> Self {
        EncoderBudget {
            max: max_num_encoder_tokens,
            num_scheduled: 0,
        }
    }

    /// Whether a span of `length` may start now: it fits, or it is the step's first.
    fn admits(&self, length: usize) -> bool {
        self.num_scheduled == 0 || self.num_scheduled + length <= self.max
    }

    /// Gives back what a row dropped from the step (its sequence preempted) had started.
    pub fn refund(&mut self, num_tokens: usize) {
        self.num_scheduled -= num_tokens;
    }
}

impl Scheduler {
    /// How many of the `num_tokens` positions `key` would compute from position `start` the
    /// step's encoder budget allows: all of them, or up to the offset of the first span the
    /// chunk would start that the budget cannot cover (0: `key` waits for the next step).
    /// Spends nothing; `spend_encoder` does once the row is taken.
    pub(super) fn encoder_limit(&self, key: SeqKey, start: usize, num_tokens: usize) -> usize {
        self.encoder_cut(key, start, num_tokens, &mut self.encoder.clone())
    }

    /// `encoder_limit` for the members of a group admitted together, each `(key, start)`
    /// computing up to `num_tokens`: each member is cut against what those before it start.
    pub(super) fn encoder_limits(
        &self,
        members: &[(SeqKey, usize)],
        num_tokens: usize,
    ) -> Vec<usize> {
        let mut budget = self.encoder;
        members
            .iter()
            .map(|&(key, start)| self.encoder_cut(key, start, num_tokens, &mut budget))
            .collect()
    }

    /// `encoder_limit` against `budget`, adding what the allowed chunk starts to it.
    fn encoder_cut(
        &self,
        key: SeqKey,
        start: usize,
        num_tokens: usize,
        budget: &mut EncoderBudget,
    ) -> usize {
        let s = self.seq(key);
        let end = start + num_tokens;
        // A waiting sequence counts from `start` (what admission will find cached) on.
        let first = s.num_encoded_spans.max(num_spans_done(&s.media, start));
        for span in &s.media[first..] {
            if span.offset >= end {
                break;
            }
            if !budget.admits(span.length) {
                return span.offset.saturating_sub(start);
            }
            budget.num_scheduled += span.length;
        }
        num_tokens
    }

    /// Spends the encoder budget on the spans that `key`'s row of `num_tokens` from its
    /// computed tokens on starts (as `encoder_limit` allowed); returns the tokens spent (the
    /// row keeps them, to give them back if it is dropped).
    pub(super) fn spend_encoder(&mut self, key: SeqKey, num_tokens: usize) -> usize {
        let s = self.seqs[key as usize].as_mut().expect("live");
        let end = s.num_computed_tokens + num_tokens;
        let mut spent = 0;
        while let Some(span) = s.media.get(s.num_encoded_spans) {
            if span.offset >= end {
                break;
            }
            spent += span.length;
            s.num_encoded_spans += 1;
        }
        self.encoder.num_scheduled += spent;
        spent
    }
}
