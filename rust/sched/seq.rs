//! Sequences and their groups. A request is a group of sequences: one before its prompt is done
//! (holding a seat for each sequence it will become), then as many as its behaviour makes of it.
//! A sequence is tokens plus the KV blocks that hold them; what a behaviour keeps per sequence
//! rides along in [`SeqExt`], and per request in [`Behaviour`].

use std::sync::Arc;

use super::behaviour::{Behaviour, SeqExt};
use super::media::{media_key, MediaSpan};
use super::rank::{effective_priority, Rank, SeqKey};
use super::text::TextState;
use crate::kv::{block_hash, root_hash, with_extra};
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
    /// Seats this sequence holds: one per sequence it will fork into while it is a request's
    /// first sequence before its prompt is done, else 1.
    pub seats: usize,
    pub extra_key: Option<Arc<str>>,
    /// The request's media spans in prompt order (shared by its sequences); empty for text.
    pub media: Arc<[MediaSpan]>,
    /// Leading `media` spans whose encoder work was counted since the sequence was last
    /// admitted, or whose KV it found cached then (0 while waiting; set on admission, so a
    /// recompute after preemption counts them again).
    pub num_encoded_spans: usize,
    /// The request's LoRA adapter (0: none).
    pub lora_id: u32,
    /// The request's parameters, shared by its sequences (read on every appended token).
    pub params: Arc<SamplingParams>,
    pub status: SeqStatus,
    pub finish: Option<FinishReason>,
    /// Seed of the sequence's random stream: the request's seed, or one drawn at random.
    pub seed: u64,
    /// Detokenizer and stop-string state; `None` when the scheduler has no tokenizer or the
    /// behaviour decodes the text itself.
    pub text: Option<Box<TextState>>,
    /// Multi-token stop sequences of the request (shared by its sequences).
    pub token_stops: Option<Arc<TokenStops>>,
    /// A member of a gang: its group's sequences sample in the same step or not at all, so it
    /// computes its last token only in the step where the whole group does (see
    /// [`Sequence::compute_target`]), is admitted with the group and preempted with it.
    pub gang: bool,
    /// What the request's behaviours keep for this sequence.
    pub ext: SeqExt,
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
            let parent = match self.block_media_key(j, block_size) {
                Some(key) => with_extra(parent, &key),
                None => parent,
            };
            let tokens = &self.tokens[j * block_size..(j + 1) * block_size];
            self.block_hashes.push(block_hash(parent, tokens));
        }
        self.block_hashes[i]
    }

    /// The bytes naming the media spans that overlap block `i` (None: plain text), which its
    /// hash mixes in and a prefix-cache hit on it must match.
    pub fn block_media_key(&self, i: usize, block_size: usize) -> Option<Vec<u8>> {
        match self.media.is_empty() {
            true => None,
            false => media_key(&self.media, i * block_size, (i + 1) * block_size),
        }
    }

    /// True while this is a request's first sequence and it still has to fork.
    pub fn will_fork(&self) -> bool {
        self.seats > 1
    }

    /// Tokens this sequence computes on its own. A gang member stops one short of its end (it
    /// gets there only after a preemption): its last token is computed in the step where its
    /// whole gang samples together.
    pub fn compute_target(&self) -> usize {
        self.tokens.len() - usize::from(self.gang)
    }
}

/// What the scheduler keeps per request: its group of live sequences and its behaviour.
#[derive(Debug)]
pub(crate) struct Group {
    pub deadline: Option<f64>,
    /// Live sequences of this request.
    pub seqs: Vec<SeqKey>,
    /// The request's behaviour and its state.
    pub behaviour: Behaviour,
}
