//! Request and sequence state. A request owns `n` sequences; before its first token it has one
//! (index 0), which forks into `n` when its prompt is done.

use std::cmp::Ordering;
use std::sync::Arc;

use super::text::TextState;
use crate::kv::{block_hash, root_hash};
use crate::params::SamplingParams;
use crate::stop::TokenStops;
use crate::types::{BlockId, FinishReason, RequestId, SeqStatus, TokenId};

/// Index of a sequence in the scheduler's slab.
pub(crate) type SeqKey = u32;

/// The effective priority of a request: `priority` improved by one level per `aging_s` seconds
/// since `arrival`, never better than 1. `aging_s == 0` turns aging off.
pub(crate) fn effective_priority(priority: u8, arrival: f64, now: f64, aging_s: f64) -> u8 {
    if aging_s <= 0.0 || priority <= 1 {
        return priority;
    }
    let levels = ((now - arrival) / aging_s).floor();
    if levels >= f64::from(priority - 1) {
        1
    } else if levels >= 1.0 {
        priority - levels as u8
    } else {
        priority
    }
}

/// Scheduling order: better effective priority first, then earlier arrival, then ids.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rank {
    pub priority: u8,
    pub arrival: f64,
    pub req_id: u64,
    pub seq_index: u32,
}

impl Rank {
    pub fn cmp(&self, other: &Rank) -> Ordering {
        self.priority
            .cmp(&other.priority)
            .then(self.arrival.total_cmp(&other.arrival))
            .then(self.req_id.cmp(&other.req_id))
            .then(self.seq_index.cmp(&other.seq_index))
    }
}

/// One sequence of tokens with its KV blocks.
#[derive(Debug, Clone)]
pub(crate) struct Sequence {
    pub req_id: RequestId,
    pub seq_index: u32,
    pub priority: u8,
    pub arrival: f64,
    /// Prompt followed by the output so far.
    pub tokens: Vec<TokenId>,
    pub num_prompt_tokens: usize,
    /// Tokens whose KV is in `block_table`.
    pub num_computed_tokens: usize,
    pub block_table: Vec<BlockId>,
    /// Chained hashes of the leading full blocks of `tokens` (computed lazily, kept across
    /// preemption since the tokens do not change).
    pub block_hashes: Vec<u64>,
    /// Leading blocks of `block_table` already offered to the prefix cache.
    pub num_cached_blocks: usize,
    /// Seats this sequence holds: `n` for a request's first sequence before it forks, else 1.
    pub seats: usize,
    pub extra_key: Option<Arc<str>>,
    /// The request's parameters, shared by its sequences (read on every appended token).
    pub params: Arc<SamplingParams>,
    pub status: SeqStatus,
    pub finish: Option<FinishReason>,
    /// Seed of the sequence's random stream: the request's seed, or one drawn at random.
    pub seed: u64,
    /// Detokenizer and stop-string state; `None` when the scheduler has no tokenizer.
    pub text: Option<Box<TextState>>,
    /// Multi-token stop sequences of the request (shared by its sequences).
    pub token_stops: Option<Arc<TokenStops>>,
}

impl Sequence {
    pub fn num_output_tokens(&self) -> usize {
        self.tokens.len() - self.num_prompt_tokens
    }

    pub fn rank(&self, now: f64, aging_s: f64) -> Rank {
        Rank {
            priority: effective_priority(self.priority, self.arrival, now, aging_s),
            arrival: self.arrival,
            req_id: self.req_id.0,
            seq_index: self.seq_index,
        }
    }

    /// The chained hash of full block `i` of `tokens`, computing the chain up to it on first use.
    pub fn block_hash(&mut self, i: usize, block_size: usize) -> u64 {
        while self.block_hashes.len() <= i {
            let j = self.block_hashes.len();
            let parent = match j {
                0 => root_hash(self.extra_key.as_deref()),
                _ => self.block_hashes[j - 1],
            };
            let tokens = &self.tokens[j * block_size..(j + 1) * block_size];
            self.block_hashes.push(block_hash(parent, tokens));
        }
        self.block_hashes[i]
    }

    /// True while this is a request's first sequence and it still has to fork.
    pub fn will_fork(&self) -> bool {
        self.seats > 1
    }
}

/// What the scheduler keeps per request.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub deadline: Option<f64>,
    /// Live sequences of this request.
    pub seqs: Vec<SeqKey>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aging_gains_one_level_per_interval_and_stops_at_one() {
        assert_eq!(effective_priority(5, 0.0, 9.9, 10.0), 5);
        assert_eq!(effective_priority(5, 0.0, 10.0, 10.0), 4);
        assert_eq!(effective_priority(5, 0.0, 35.0, 10.0), 2);
        assert_eq!(effective_priority(5, 0.0, 1e9, 10.0), 1);
        assert_eq!(effective_priority(3, 0.0, 1e9, 0.0), 3);
        assert_eq!(effective_priority(1, 0.0, 1e9, 10.0), 1);
        // A clock that went backwards never makes a request worse.
        assert_eq!(effective_priority(4, 100.0, 0.0, 10.0), 4);
    }
}
