//! `Scheduler`: request intake, `schedule()` (running first, then admission, preempting by
//! recompute when blocks or seats run short), aborts and deadlines. `update()` is in update.rs.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::config::SchedulerConfig;
use super::plan::{PlanRecord, Row, StepPlan};
use super::queue::WaitingQueue;
use super::request::{Rank, Request, SeqKey, Sequence};
use crate::detok::Detokenizer;
use crate::error::{CoreError, CoreResult};
use crate::kv::BlockPool;
use crate::params::{check_priority, SamplingParams};
use crate::sampling::SamplerConfig;
use crate::types::{BlockId, FinishReason, RequestId, SeqStatus, TokenId};

/// Counters and gauges for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    pub num_running_seqs: usize,
    pub num_waiting_seqs: usize,
    pub num_unfinished_requests: usize,
    pub num_free_blocks: usize,
    pub num_used_blocks: usize,
    pub num_cached_blocks: usize,
    pub num_prefix_queried_blocks: u64,
    pub num_prefix_hit_blocks: u64,
    pub num_preemptions: u64,
    pub num_steps: u64,
}

/// A read-only view of one live sequence (for tests, debugging and invariant checks).
#[derive(Debug, Clone, PartialEq)]
pub struct SeqView {
    pub req_id: RequestId,
    pub seq_index: u32,
    pub priority: u8,
    pub arrival: f64,
    pub status: SeqStatus,
    pub tokens: Vec<TokenId>,
    pub num_prompt_tokens: usize,
    pub num_computed_tokens: usize,
    pub block_table: Vec<BlockId>,
}

/// The continuous-batching scheduler. See the module docs of `sched` for the policy.
#[derive(Debug)]
pub struct Scheduler {
    pub(crate) cfg: SchedulerConfig,
    pub(crate) pool: BlockPool,
    pub(crate) seqs: Vec<Option<Sequence>>,
    free_slots: Vec<SeqKey>,
    pub(crate) requests: FxHashMap<RequestId, Request>,
    pub(crate) waiting: WaitingQueue,
    /// Running sequences, best rank first after each `schedule()`.
    pub(crate) running: Vec<SeqKey>,
    pub(crate) num_running_seats: usize,
    pending_aborts: Vec<RequestId>,
    /// Sequences ended since the last `drop_finished()`.
    just_finished: Vec<SeqKey>,
    pub(crate) num_deadlines: usize,
    pub(crate) step: u64,
    pub(crate) last: Option<PlanRecord>,
    pub(crate) num_preemptions: u64,
    /// Turns sampled tokens into text; without it outputs carry token ids only.
    pub(crate) detok: Option<Arc<Detokenizer>>,
    pub(crate) sampler: SamplerConfig,
    /// Source of the random seeds of unseeded requests (OS-seeded per scheduler).
    seed_source: RandomState,
}

impl Scheduler {
    /// A scheduler with an empty pool of `cfg.num_blocks` blocks.
    pub fn new(cfg: SchedulerConfig) -> CoreResult<Self> {
        cfg.validate()?;
        Ok(Scheduler {
            pool: BlockPool::new(cfg.num_blocks, cfg.block_size),
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
            sampler: SamplerConfig::default(),
            seed_source: RandomState::new(),
        })
    }

    /// Gives the scheduler a tokenizer: from now on `update()` detokenizes every appended token
    /// and applies stop strings. Requests already queued keep producing token ids only.
    pub fn set_detokenizer(&mut self, detok: Option<Arc<Detokenizer>>) {
        self.detok = detok;
    }

    /// Sets how `update_with_logits()` samples (for example where logprobs are taken).
    pub fn set_sampler_config(&mut self, cfg: SamplerConfig) {
        self.sampler = cfg;
    }

    /// A fresh random seed for an unseeded request.
    fn random_seed(&self, req_id: RequestId) -> u64 {
        self.seed_source
            .hash_one((req_id.0, self.step, self.seqs.len()))
    }

    /// The configuration this scheduler was built with.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// The block pool (read-only).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Queues a request. Fails on a reused id, an empty or too-long prompt, a bad priority or
    /// deadline, `n` above `max_num_seqs`, or a full waiting queue (`QueueFull`).
    #[allow(clippy::too_many_arguments)]
    pub fn add_request(
        &mut self,
        req_id: RequestId,
        prompt_token_ids: Vec<TokenId>,
        params: Arc<SamplingParams>,
        priority: u8,
        arrival_time: f64,
        deadline: Option<f64>,
        extra_key: Option<Arc<str>>,
    ) -> CoreResult<()> {
        self.check_new_request(req_id, &prompt_token_ids, &params, priority, deadline)?;
        let (text, token_stops) = self.text_state_for(&params)?;
        let seed = params.seed.unwrap_or_else(|| self.random_seed(req_id));
        let seats = params.n as usize;
        let key = self.insert_seq(Sequence {
            req_id,
            seq_index: 0,
            priority,
            arrival: arrival_time,
            num_prompt_tokens: prompt_token_ids.len(),
            tokens: prompt_token_ids,
            num_computed_tokens: 0,
            block_table: Vec::new(),
            block_hashes: Vec::new(),
            num_cached_blocks: 0,
            seats,
            extra_key,
            params,
            status: SeqStatus::Waiting,
            finish: None,
            seed,
            text,
            token_stops,
        });
        self.waiting
            .push_back(key, priority, arrival_time, req_id.0, 0);
        self.num_deadlines += usize::from(deadline.is_some());
        self.requests.insert(
            req_id,
            Request {
                deadline,
                seqs: vec![key],
            },
        );
        Ok(())
    }

    fn check_new_request(
        &self,
        req_id: RequestId,
        prompt: &[TokenId],
        params: &SamplingParams,
        priority: u8,
        deadline: Option<f64>,
    ) -> CoreResult<()> {
        if self.requests.contains_key(&req_id) {
            return Err(CoreError::invalid(
                "request_id",
                "duplicate",
                format!(
                    "`request_id` {} is already in use by an unfinished request",
                    req_id.0
                ),
            ));
        }
        if prompt.is_empty() {
            return Err(CoreError::invalid(
                "prompt_token_ids",
                "empty",
                "`prompt_token_ids` must contain at least 1 token",
            ));
        }
        if prompt.len() >= self.cfg.max_model_len {
            return Err(CoreError::invalid(
                "prompt_token_ids",
                "too_long",
                format!(
                    "`prompt_token_ids` has {} tokens; it must be shorter than max_model_len ({}) to leave room for output",
                    prompt.len(),
                    self.cfg.max_model_len
                ),
            ));
        }
        check_priority(i64::from(priority))?;
        if deadline.is_some_and(|d| !d.is_finite()) {
            return Err(CoreError::invalid(
                "deadline",
                "not_finite",
                "`deadline` must be a finite time in seconds",
            ));
        }
        if params.n as usize > self.cfg.max_num_seqs {
            return Err(CoreError::invalid(
                "n",
                "out_of_range",
                format!(
                    "`n` must be <= max_num_seqs ({}); got {}",
                    self.cfg.max_num_seqs, params.n
                ),
            ));
        }
        if self.waiting.len() >= self.cfg.max_num_waiting {
            return Err(CoreError::QueueFull {
                max_num_waiting: self.cfg.max_num_waiting,
            });
        }
        Ok(())
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

    /// Plans the next step at time `now` (seconds, same clock as arrival times and deadlines).
    pub fn schedule(&mut self, now: f64) -> StepPlan {
        self.step += 1;
        let mut plan = StepPlan {
            step_id: self.step,
            ..StepPlan::default()
        };
        self.end_aborted_and_expired(now, &mut plan);
        let mut rows = Vec::new();
        let mut budget = self.cfg.max_num_batched_tokens;
        self.sort_running(now);
        let preempted = self.schedule_running(&mut budget, &mut rows, &mut plan);
        if !preempted {
            self.admit_waiting(now, &mut budget, &mut rows, &mut plan);
        }
        self.materialize(rows, plan)
    }

    fn materialize(&mut self, rows: Vec<Row>, mut plan: StepPlan) -> StepPlan {
        let bs = self.cfg.block_size;
        let mut num_samples = Vec::with_capacity(rows.len());
        let mut total_samples = 0;
        for (r, row) in rows.iter().enumerate() {
            let seq = self.seqs[row.key as usize]
                .as_ref()
                .expect("scheduled sequence is live");
            let samples = plan.push_row(seq, row.num_tokens, bs, r as i32);
            num_samples.push(samples);
            total_samples += samples as usize;
            if let Some((src, dst)) = row.copy {
                plan.block_copies.extend([src.0 as i32, dst.0 as i32]);
            }
        }
        let seqs = &self.seqs;
        plan.fill_block_tables(rows.iter().map(|row| {
            seqs[row.key as usize]
                .as_ref()
                .map_or(&[][..], |s| &s.block_table[..])
        }));
        self.last = Some(PlanRecord {
            step_id: plan.step_id,
            rows,
            num_samples,
            total_samples,
        });
        plan
    }

    fn sort_running(&mut self, now: f64) {
        let (seqs, aging) = (&self.seqs, self.cfg.priority_aging_s);
        let rank = |k: &SeqKey| seqs[*k as usize].as_ref().unwrap().rank(now, aging);
        if !self
            .running
            .is_sorted_by(|a, b| rank(a).cmp(&rank(b)).is_le())
        {
            self.running.sort_by(|a, b| rank(a).cmp(&rank(b)));
        }
    }

    /// Gives running sequences their next tokens, best rank first. When one cannot get a block,
    /// the worst-ranked running sequence (possibly itself) is preempted. Returns whether any was.
    fn schedule_running(
        &mut self,
        budget: &mut usize,
        rows: &mut Vec<Row>,
        plan: &mut StepPlan,
    ) -> bool {
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let key = self.running[i];
            let num_tokens = {
                let s = self.seq(key);
                (s.tokens.len() - s.num_computed_tokens).min(*budget)
            };
            let copy = loop {
                if let Some(copy) = self.reserve_blocks(key, num_tokens) {
                    break Some(copy);
                }
                // Running is sorted, so the last entry is the worst-ranked one (at or after `i`).
                let victim = *self.running.last().expect("`key` itself is running");
                self.preempt(victim, rows, budget, plan);
                preempted = true;
                if victim == key {
                    break None;
                }
            };
            let Some(copy) = copy else { break };
            rows.push(Row {
                key,
                num_tokens,
                copy,
            });
            *budget -= num_tokens;
            i += 1;
        }
        preempted
    }

    /// Reserves the blocks `key` needs to compute `num_tokens` more tokens, copying a shared
    /// partial block first (copy-on-write). Returns None, changing nothing, if too few are free;
    /// else the copy made, if any.
    fn reserve_blocks(
        &mut self,
        key: SeqKey,
        num_tokens: usize,
    ) -> Option<Option<(BlockId, BlockId)>> {
        let bs = self.cfg.block_size;
        let s = self.seqs[key as usize].as_mut().expect("live");
        let end = s.num_computed_tokens + num_tokens;
        let num_new = end.div_ceil(bs).saturating_sub(s.block_table.len());
        let write_block = s.num_computed_tokens / bs;
        let shared = s
            .block_table
            .get(write_block)
            .is_some_and(|&b| self.pool.ref_count(b) > 1);
        if self.pool.num_free() < num_new + usize::from(shared) {
            return None;
        }
        let mut copy = None;
        if shared {
            let src = s.block_table[write_block];
            let mut dst = Vec::with_capacity(1);
            self.pool.allocate_into(1, &mut dst);
            self.pool.free(&[src]);
            s.block_table[write_block] = dst[0];
            copy = Some((src, dst[0]));
        }
        self.pool.allocate_into(num_new, &mut s.block_table);
        Some(copy)
    }

    /// Preempts a running sequence by recompute: frees its blocks, drops its row from this step
    /// if it had one (refunding the budget), and queues it at the front of its priority.
    fn preempt(
        &mut self,
        key: SeqKey,
        rows: &mut Vec<Row>,
        budget: &mut usize,
        plan: &mut StepPlan,
    ) {
        let pos = self
            .running
            .iter()
            .rposition(|&k| k == key)
            .expect("victim is running");
        self.running.remove(pos);
        if let Some(r) = rows.iter().rposition(|row| row.key == key) {
            *budget += rows.remove(r).num_tokens;
        }
        let s = self.seqs[key as usize].as_mut().expect("live");
        self.pool.free(&s.block_table);
        s.block_table.clear();
        s.num_computed_tokens = 0;
        s.num_cached_blocks = 0;
        s.status = SeqStatus::Preempted;
        self.num_running_seats -= s.seats;
        self.waiting
            .push_front(key, s.priority, s.arrival, s.req_id.0, s.seq_index);
        plan.preempted_req_ids.push(s.req_id.0);
        plan.preempted_seq_indices.push(s.seq_index);
        self.num_preemptions += 1;
    }

    /// Admits waiting sequences in rank order while budget, seats and blocks last. A waiting
    /// sequence short of seats or blocks preempts running work of a strictly worse effective
    /// priority; otherwise admission stops (no overtaking, so big requests are not starved).
    fn admit_waiting(
        &mut self,
        now: f64,
        budget: &mut usize,
        rows: &mut Vec<Row>,
        plan: &mut StepPlan,
    ) {
        let aging = self.cfg.priority_aging_s;
        while *budget > 0 {
            let Some((key, rank)) = self.waiting.peek(now, aging) else {
                break;
            };
            let hits = self.find_cached_prefix(key);
            loop {
                let seats = self.seq(key).seats;
                let seats_ok = self.num_running_seats + seats <= self.cfg.max_num_seqs;
                if seats_ok && self.pool.num_free() >= self.blocks_to_admit(key, &hits, *budget) {
                    break;
                }
                if !self.preempt_worse_than(rank, now, rows, budget, plan) {
                    return;
                }
            }
            let num_tokens = self.admit(key, &hits, *budget);
            rows.push(Row {
                key,
                num_tokens,
                copy: None,
            });
            *budget -= num_tokens;
        }
    }

    /// Blocks that admitting `key` with prefix `hits` and this budget takes from the free list.
    fn blocks_to_admit(&self, key: SeqKey, hits: &[BlockId], budget: usize) -> usize {
        let s = self.seq(key);
        let num_cached = hits.len() * self.cfg.block_size;
        let end = num_cached + (s.tokens.len() - num_cached).min(budget);
        let revived = hits
            .iter()
            .filter(|&&b| self.pool.ref_count(b) == 0)
            .count();
        end.div_ceil(self.cfg.block_size) - hits.len() + revived
    }

    fn admit(&mut self, key: SeqKey, hits: &[BlockId], budget: usize) -> usize {
        let bs = self.cfg.block_size;
        for &b in hits {
            self.pool.incref(b);
        }
        let s = self.seqs[key as usize].as_mut().expect("live");
        self.waiting.pop(key, s.priority);
        s.block_table.clear();
        s.block_table.extend_from_slice(hits);
        s.num_computed_tokens = hits.len() * bs;
        s.num_cached_blocks = hits.len();
        let num_tokens = (s.tokens.len() - s.num_computed_tokens).min(budget);
        let end = s.num_computed_tokens + num_tokens;
        let ok = self
            .pool
            .allocate_into(end.div_ceil(bs) - hits.len(), &mut s.block_table);
        debug_assert!(ok, "blocks were counted before admitting");
        s.status = SeqStatus::Running;
        self.num_running_seats += s.seats;
        self.running.push(key);
        num_tokens
    }

    /// Preempts the worst-ranked running sequence if its effective priority is strictly worse
    /// than `rank`'s. Returns whether it did.
    fn preempt_worse_than(
        &mut self,
        rank: Rank,
        now: f64,
        rows: &mut Vec<Row>,
        budget: &mut usize,
        plan: &mut StepPlan,
    ) -> bool {
        let aging = self.cfg.priority_aging_s;
        let worst = self
            .running
            .iter()
            .map(|&k| (k, self.seq(k).rank(now, aging)))
            .max_by(|a, b| a.1.cmp(&b.1));
        match worst {
            Some((victim, victim_rank)) if victim_rank.priority > rank.priority => {
                self.preempt(victim, rows, budget, plan);
                true
            }
            _ => false,
        }
    }

    /// The longest confirmed run of cached blocks at the start of `key`'s tokens, leaving at
    /// least the last token to compute.
    fn find_cached_prefix(&mut self, key: SeqKey) -> Vec<BlockId> {
        if !self.cfg.enable_prefix_caching {
            return Vec::new();
        }
        let bs = self.cfg.block_size;
        let s = self.seqs[key as usize].as_mut().expect("live");
        let max_blocks = (s.tokens.len() - 1) / bs;
        let mut hits = Vec::new();
        for i in 0..max_blocks {
            let hash = s.block_hash(i, bs);
            let cache_key = self
                .pool
                .key_after(hits.last().copied(), s.extra_key.as_ref());
            let tokens = &s.tokens[i * bs..(i + 1) * bs];
            match self.pool.lookup(hash, tokens, &cache_key) {
                Some(b) => hits.push(b),
                None => break,
            }
        }
        hits
    }

    /// Ends aborted requests and those past their deadline, freeing their blocks.
    fn end_aborted_and_expired(&mut self, now: f64, plan: &mut StepPlan) {
        let mut ended: Vec<(RequestId, FinishReason)> = self
            .pending_aborts
            .drain(..)
            .map(|id| (id, FinishReason::Abort))
            .collect();
        if self.num_deadlines > 0 {
            for (&id, req) in &self.requests {
                if req.deadline.is_some_and(|d| d <= now) && !ended.iter().any(|e| e.0 == id) {
                    ended.push((id, FinishReason::Timeout));
                }
            }
        }
        if ended.is_empty() {
            return;
        }
        for &(id, reason) in &ended {
            let keys = self.requests[&id].seqs.clone();
            for key in keys {
                self.finish_seq(key, reason);
            }
            plan.push_finished(id, reason);
        }
        self.drop_finished();
    }

    /// Ends one sequence: frees its blocks and seats. `drop_finished` then clears it out.
    pub(crate) fn finish_seq(&mut self, key: SeqKey, reason: FinishReason) {
        let s = self.seqs[key as usize].as_mut().expect("live");
        if s.status == SeqStatus::Running {
            self.num_running_seats -= s.seats;
        }
        self.pool.free(&s.block_table);
        s.block_table.clear();
        s.status = SeqStatus::Finished;
        s.finish = Some(reason);
        self.just_finished.push(key);
    }

    /// Removes the sequences ended since the last call from the queues and the slab, and the
    /// requests left with none. Returns those requests.
    pub(crate) fn drop_finished(&mut self) -> Vec<RequestId> {
        let mut done = Vec::new();
        if self.just_finished.is_empty() {
            return done;
        }
        let seqs = &self.seqs;
        let live = |k: SeqKey| {
            seqs[k as usize]
                .as_ref()
                .is_some_and(|s| s.status != SeqStatus::Finished)
        };
        self.running.retain(|&k| live(k));
        self.waiting.retain(live);
        for k in std::mem::take(&mut self.just_finished) {
            let s = self.seqs[k as usize]
                .take()
                .expect("finished sequence is in the slab");
            self.free_slots.push(k);
            let req = self
                .requests
                .get_mut(&s.req_id)
                .expect("request of a live seq");
            req.seqs.retain(|&x| x != k);
            if req.seqs.is_empty() {
                let req = self.requests.remove(&s.req_id).expect("present");
                self.num_deadlines -= usize::from(req.deadline.is_some());
                self.pending_aborts.retain(|&id| id != s.req_id);
                done.push(s.req_id);
            }
        }
        done
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
