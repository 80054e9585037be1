//! `Scheduler`: its state, construction and read-only queries. The work is split by concept:
//! intake.rs (`add_request`), schedule.rs (`schedule()`: running first, then admission),
//! preempt.rs (preemption by recompute), finish.rs (aborts, deadlines, failures, ending
//! sequences) and update.rs (`update()` / `update_with_logits()`).

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::beam::EndedBeams;
use super::config::SchedulerConfig;
use super::intake::SeedSource;
use super::queue::WaitingQueue;
use super::rank::SeqKey;
use super::request::{Request, Sequence};
use super::schedule::PlanRecord;
use crate::detok::Detokenizer;
use crate::error::CoreResult;
use crate::kv::BlockPool;
use crate::sampling::SamplerConfig;
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

/// The continuous-batching scheduler. See the module docs of `sched` for the policy.
#[derive(Debug)]
pub struct Scheduler {
    pub(crate) cfg: SchedulerConfig,
    pub(crate) pool: BlockPool,
    pub(crate) seqs: Vec<Option<Sequence>>,
    pub(crate) free_slots: Vec<SeqKey>,
    pub(crate) requests: FxHashMap<RequestId, Request>,
    pub(crate) waiting: WaitingQueue,
    /// Running sequences, best rank first after each `schedule()`.
    pub(crate) running: Vec<SeqKey>,
    pub(crate) num_running_seats: usize,
    pub(crate) pending_aborts: Vec<RequestId>,
    /// Sequences ended since the last `drop_finished()`.
    pub(crate) just_finished: Vec<SeqKey>,
    pub(crate) num_deadlines: usize,
    pub(crate) step: u64,
    pub(crate) last: Option<PlanRecord>,
    pub(crate) num_preemptions: u64,
    /// Turns sampled tokens into text; without it outputs carry token ids only.
    pub(crate) detok: Option<Arc<Detokenizer>>,
    pub(crate) sampler: SamplerConfig,
    /// Where unseeded requests get their seeds.
    pub(crate) seeds: SeedSource,
    /// Requests added so far (orders the seeds of unseeded requests).
    pub(crate) num_added: u64,
    /// Beam searches ended by an abort or deadline at `schedule()`, with their best hypotheses
    /// so far: the next `update()` emits them (see `beam::keep_beams_of_ended`).
    pub(crate) ended_beams: Vec<EndedBeams>,
    pub(crate) num_draft_tokens: u64,
    pub(crate) num_accepted_draft_tokens: u64,
}

impl Scheduler {
    /// A scheduler with an empty pool of `cfg.num_blocks` blocks.
    pub fn new(cfg: SchedulerConfig) -> CoreResult<Self> {
        cfg.validate()?;
        Ok(Scheduler {
            pool: BlockPool::new(cfg.num_blocks, cfg.block_size),
            sampler: cfg.sampler(),
            seeds: SeedSource::new(cfg.seed),
            cfg,
            seqs: Vec::new(),
            free_slots: Vec::new(),
            requests: FxHashMap::default(),
            waiting: WaitingQueue::default(),
            running: Vec::new(),
            num_running_seats: 0,
            pending_aborts: Vec::new(),
            just_finished: Vec::new(),
            num_deadlines: 0,
            step: 0,
            last: None,
            num_preemptions: 0,
            detok: None,
            num_added: 0,
            ended_beams: Vec::new(),
            num_draft_tokens: 0,
            num_accepted_draft_tokens: 0,
        })
    }

    /// Gives the scheduler a tokenizer: from now on `update()` detokenizes every appended token
    /// and applies stop strings. Requests already queued keep producing token ids only.
    pub fn set_detokenizer(&mut self, detok: Option<Arc<Detokenizer>>) {
        self.detok = detok;
    }

    /// The configuration this scheduler was built with.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// The block pool (read-only).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Marks a request for abort; it ends (reason abort) at the next `schedule()`. Returns false
    /// if no unfinished request has this id.
    pub fn abort_request(&mut self, req_id: RequestId) -> bool {
        if !self.requests.contains_key(&req_id) || self.pending_aborts.contains(&req_id) {
            return false;
        }
        self.pending_aborts.push(req_id);
        true
    }

    /// Whether any request is waiting or running.
    pub fn has_unfinished_requests(&self) -> bool {
        !self.requests.is_empty()
    }

    /// Counters and gauges.
    pub fn stats(&self) -> SchedulerStats {
        let cache = self.pool.stats();
        SchedulerStats {
            num_running_seqs: self.running.len(),
            num_waiting_seqs: self.waiting.len(),
            num_unfinished_requests: self.requests.len(),
            num_free_blocks: self.pool.num_free(),
            num_used_blocks: self.pool.num_blocks() - 1 - self.pool.num_free(),
            num_cached_blocks: self.pool.num_cached(),
            num_prefix_queried_blocks: cache.num_queried_blocks,
            num_prefix_hit_blocks: cache.num_hit_blocks,
            num_preemptions: self.num_preemptions,
            num_steps: self.step,
            num_draft_tokens: self.num_draft_tokens,
            num_accepted_draft_tokens: self.num_accepted_draft_tokens,
        }
    }

    /// Every live sequence.
    pub fn sequences(&self) -> Vec<SeqView> {
        self.seqs
            .iter()
            .flatten()
            .map(|s| SeqView {
                req_id: s.req_id,
                seq_index: s.seq_index,
                priority: s.priority,
                arrival: s.arrival,
                status: s.status,
                tokens: s.tokens.clone(),
                num_prompt_tokens: s.num_prompt_tokens,
                num_computed_tokens: s.num_computed_tokens,
                block_table: s.block_table.clone(),
            })
            .collect()
    }

    pub(crate) fn insert_seq(&mut self, seq: Sequence) -> SeqKey {
        match self.free_slots.pop() {
            Some(k) => {
                self.seqs[k as usize] = Some(seq);
                k
            }
            None => {
                self.seqs.push(Some(seq));
                (self.seqs.len() - 1) as SeqKey
            }
        }
    }

    pub(crate) fn seq(&self, key: SeqKey) -> &Sequence {
        self.seqs[key as usize].as_ref().expect("live sequence")
    }
}
