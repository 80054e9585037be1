//! The scheduler core: sequences and their groups, one token budget, admission, preemption and
//! KV blocks. It knows no behaviour by name: at its edges it asks `behaviour` what a request does
//! (how many samples a row yields, whether a row computes tentative tokens, how samples are
//! drawn and applied, what a request leaves when it ends early).
//!
//! `Scheduler`'s fields are private to this module. The work is split by concept over
//! intake.rs (`add_request`), schedule.rs (`schedule()`: running first, then admission),
//! blocks.rs (reserving, sharing and caching KV blocks), encoder.rs (the per-step encoder
//! budget of media spans), preempt.rs (preemption by recompute),
//! finish.rs (aborts, deadlines, failures, ending sequences), update.rs (`update()` /
//! `update_with_logits()`) and append.rs (one token onto a sequence). Behaviours reach the
//! state through the methods below, never the fields.

mod append;
mod blocks;
mod encoder;
mod finish;
mod groups;
mod intake;
mod invariants;
mod preempt;
mod schedule;
mod update;

use std::sync::Arc;

use rustc_hash::FxHashMap;

pub(crate) use schedule::{PlanRecord, Row};
pub(crate) use update::Samples;

use super::behaviour::Edges;
use super::config::SchedulerConfig;
use super::endings::Endings;
use super::output::OutRow;
use super::queue::WaitingQueue;
use super::rank::SeqKey;
use super::seq::{Group, Sequence};
use super::slab::Slab;
use super::stats::{SchedulerStats, SeqView};
use crate::detok::Detokenizer;
use crate::error::CoreResult;
use crate::kv::BlockPool;
use crate::sampling::SamplerConfig;
use crate::types::RequestId;
use encoder::EncoderBudget;
use intake::SeedSource;

/// The continuous-batching scheduler. See the module docs of `sched` for the policy.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    pool: BlockPool,
    seqs: Slab<Sequence>,
    groups: FxHashMap<RequestId, Group>,
    waiting: WaitingQueue,
    /// Running sequences, best rank first after each `schedule()`.
    running: Vec<SeqKey>,
    num_running_seats: usize,
    /// Aborts asked for and deadlines to watch.
    endings: Endings,
    /// Sequences ended since the last `drop_finished()`.
    just_finished: Vec<SeqKey>,
    step: u64,
    last: Option<PlanRecord>,
    num_preemptions: u64,
    /// Turns sampled tokens into text; without it outputs carry token ids only.
    detok: Option<Arc<Detokenizer>>,
    sampler: SamplerConfig,
    /// Where unseeded requests get their seeds.
    seeds: SeedSource,
    /// Requests added so far (orders the seeds of unseeded requests).
    num_added: u64,
    /// Entries made outside `update()` (what a request ended at `schedule()` leaves): the next
    /// `update()` emits them.
    held_rows: Vec<OutRow>,
    /// What the behaviours keep across steps (their counters).
    edges: Edges,
    /// The encoder budget left in the step being planned.
    encoder: EncoderBudget,
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
            seqs: Slab::new(),
            groups: FxHashMap::default(),
            waiting: WaitingQueue::default(),
            running: Vec::new(),
            num_running_seats: 0,
            endings: Endings::default(),
            just_finished: Vec::new(),
            step: 0,
            last: None,
            num_preemptions: 0,
            detok: None,
            num_added: 0,
            held_rows: Vec::new(),
            edges: Edges::default(),
            encoder: EncoderBudget::default(),
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
        self.groups.contains_key(&req_id) && self.endings.abort(req_id)
    }

    /// Whether any request is waiting or running.
    pub fn has_unfinished_requests(&self) -> bool {
        !self.groups.is_empty()
    }

    /// The waiting requests in the order they would be admitted at `now` (priorities with
    /// aging, then arrival; a preempted sequence first in its level): each request's place in
    /// the queue, for a client waiting for its first token.
    pub fn waiting_order(&self, now: f64) -> Vec<RequestId> {
        self.waiting
            .admission_order(now, self.cfg.priority_aging_s)
            .into_iter()
            .map(RequestId)
            .collect()
    }

    /// Counters and gauges.
    pub fn stats(&self) -> SchedulerStats {
        let cache = self.pool.stats();
        let mut stats = SchedulerStats {
            num_running_seqs: self.running.len(),
            num_waiting_seqs: self.waiting.len(),
            num_unfinished_requests: self.groups.len(),
            num_free_blocks: self.pool.num_free(),
            num_used_blocks: self.pool.num_blocks() - 1 - self.pool.num_free(),
            num_cached_blocks: self.pool.num_cached(),
            num_prefix_queried_blocks: cache.num_queried_blocks,
            num_prefix_hit_blocks: cache.num_hit_blocks,
            num_preemptions: self.num_preemptions,
            num_steps: self.step,
            ..SchedulerStats::default()
        };
        self.edges.add_stats(&mut stats);
        stats
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

    /// The step id of the plan awaiting `update()`, if any.
    #[cfg(test)]
    pub(crate) fn pending_step_id(&self) -> Option<u64> {
        self.last.as_ref().map(|r| r.step_id)
    }

    // ---- what behaviours reach the state through -------------------------------------------

    /// The tokenizer, if the scheduler has one.
    pub(crate) fn detok(&self) -> Option<&Detokenizer> {
        self.detok.as_deref()
    }

    /// The sampler settings.
    pub(crate) fn sampler(&self) -> &SamplerConfig {
        &self.sampler
    }

    /// A live sequence.
    pub(crate) fn seq(&self, key: SeqKey) -> &Sequence {
        self.seqs[key as usize].as_ref().expect("live sequence")
    }

    /// A live sequence, to change what its behaviour keeps or its tokens' bookkeeping.
    pub(crate) fn seq_mut(&mut self, key: SeqKey) -> &mut Sequence {
        self.seqs[key as usize].as_mut().expect("live sequence")
    }

    /// Every live sequence with its key, mutably (for work over many sequences at once).
    pub(crate) fn seqs_mut(&mut self) -> impl Iterator<Item = (SeqKey, &mut Sequence)> {
        self.seqs
            .iter_mut()
            .enumerate()
            .filter_map(|(k, s)| Some((k as SeqKey, s.as_mut()?)))
    }

    /// The group of an unfinished request.
    pub(crate) fn group(&self, req_id: RequestId) -> &Group {
        &self.groups[&req_id]
    }

    /// The group of an unfinished request, mutably (its behaviour's state).
    pub(crate) fn group_mut(&mut self, req_id: RequestId) -> &mut Group {
        self.groups
            .get_mut(&req_id)
            .expect("group of an unfinished request")
    }

    /// What the behaviours keep across steps.
    pub(crate) fn edges_mut(&mut self) -> &mut Edges {
        &mut self.edges
    }

    /// Queues entries for the next `update()`'s output.
    pub(crate) fn hold_rows(&mut self, rows: impl IntoIterator<Item = OutRow>) {
        self.held_rows.extend(rows);
    }

    fn insert_seq(&mut self, seq: Sequence) -> SeqKey {
        self.seqs.insert(seq)
    }
}
