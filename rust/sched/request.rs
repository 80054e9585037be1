//! Request and sequence state. A request owns `best_of` sequences (its candidates; `n` unless
//! the request asked for more); before its first token it has one (index 0), which forks into
//! `best_of` when its prompt is done.

use std::sync::Arc;

use super::beam::{Beam, BeamGroup};
use super::rank::{effective_priority, Rank, SeqKey};
use super::text::TextState;
use crate::grammar::GrammarState;
use crate::kv::{block_hash, root_hash};
use crate::params::SamplingParams;
use crate::stop::TokenStops;
use crate::types::{BlockId, FinishReason, RequestId, SeqStatus, TokenId};

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
    /// Seats this sequence holds: `best_of` for a request's first sequence before it forks,
    /// else 1.
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
    /// Beam search: this is one live beam of its request's group (see `beam`).
    pub beam: Option<Box<Beam>>,
    /// Constrained decoding: the grammar's state after this sequence's output so far.
    pub grammar: Option<Box<GrammarState>>,
    /// The client's draft of the output's first tokens (see `speculative`), until it is used
    /// up or the output leaves it.
    pub draft: Option<Arc<ClientDraft>>,
}

/// Draft tokens a request brought (TensorRT-LLM's `draft_input_ids` / `draft_logits`): a guess
/// of the output's first tokens, verified by the target model (see `speculative`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ClientDraft {
    pub tokens: Vec<TokenId>,
    /// Row-major `[tokens.len(), vocab]`: the drafter's logits at each draft token; its
    /// distribution is their softmax (the rows the draft tokens were drawn from).
    pub logits: Option<Vec<f32>>,
}

impl Sequence {
    /// Tokens generated so far.
    pub fn num_output_tokens(&self) -> usize {
        self.tokens.len() - self.num_prompt_tokens
    }

    /// This sequence's place in the scheduling order at `now`.
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

    /// Tokens this sequence computes on its own. A live beam stops one short of its end (it
    /// gets there only after a preemption): its last token is computed in the step where its
    /// whole group samples together (`schedule_beam_group`).
    pub fn compute_target(&self) -> usize {
        self.tokens.len() - usize::from(self.beam.is_some())
    }
}

/// What the scheduler keeps per request.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub deadline: Option<f64>,
    /// Live sequences of this request.
    pub seqs: Vec<SeqKey>,
    /// Beam search: the group's finished hypotheses and stopping state.
    pub beam: Option<Box<BeamGroup>>,
}
