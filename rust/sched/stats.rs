//! What the schedulers report about themselves: counters and gauges, and read-only views of
//! live sequences.

use crate::types::{BlockId, RequestId, SeqStatus, TokenId};

/// Counters and gauges for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    /// Sequences holding KV blocks and scheduled every step.
    pub num_running_seqs: usize,
    /// Sequences queued (new or preempted).
    pub num_waiting_seqs: usize,
    /// Requests added and not yet finished.
    pub num_unfinished_requests: usize,
    /// Blocks on the free list (cached ones included).
    pub num_free_blocks: usize,
    /// Blocks some sequence holds.
    pub num_used_blocks: usize,
    /// Blocks in the prefix cache.
    pub num_cached_blocks: usize,
    /// Full blocks looked up in the prefix cache so far.
    pub num_prefix_queried_blocks: u64,
    /// Of those, blocks found.
    pub num_prefix_hit_blocks: u64,
    /// Preemptions so far.
    pub num_preemptions: u64,
    /// `schedule()` calls so far.
    pub num_steps: u64,
    /// Draft tokens verified so far (speculative decoding).
    pub num_draft_tokens: u64,
    /// Of those, tokens the target accepted.
    pub num_accepted_draft_tokens: u64,
}

/// A read-only view of one live sequence (for tests, debugging and invariant checks).
#[derive(Debug, Clone, PartialEq)]
pub struct SeqView {
    /// The request it belongs to.
    pub req_id: RequestId,
    /// Its index (0..n) within the request.
    pub seq_index: u32,
    /// The request's priority (1 highest .. 5).
    pub priority: u8,
    /// The request's arrival time.
    pub arrival: f64,
    /// Where it is in its life.
    pub status: SeqStatus,
    /// Prompt followed by the output so far.
    pub tokens: Vec<TokenId>,
    /// Leading tokens of `tokens` that are the prompt.
    pub num_prompt_tokens: usize,
    /// Tokens whose KV is in `block_table`.
    pub num_computed_tokens: usize,
    /// Its KV blocks.
    pub block_table: Vec<BlockId>,
}
