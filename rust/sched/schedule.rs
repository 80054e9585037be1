//! `schedule()`: one token budget per step, spent on running sequences first (best rank first;
//! a sequence short of blocks preempts the worst-ranked running one), then on admitting waiting
//! sequences in rank order, reusing prefix-cached blocks.

use super::plan::{RowSpec, StepPlan};
use super::rank::SeqKey;
use super::scheduler::Scheduler;
use crate::types::{BlockId, SeqStatus};

/// One scheduled sequence: `num_tokens` tokens from its `num_computed_tokens` on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Row {
    pub key: SeqKey,
    pub num_tokens: usize,
    /// Copy-on-write done for this row before its KV is written: (source, destination).
    pub copy: Option<(BlockId, BlockId)>,
}

/// What `update()` needs to remember of the last plan.
#[derive(Debug, Clone)]
pub(crate) struct PlanRecord {
    pub step_id: u64,
    pub rows: Vec<Row>,
    /// Samples per row: 0 while a prefill chunk is unfinished, `n` for a row that forks, else 1.
    pub num_samples: Vec<u32>,
    pub total_samples: usize,
}

impl Scheduler {
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
            let s = self.seq(row.key);
            let spec = RowSpec {
                req_id: s.req_id,
                seq_index: s.seq_index,
                tokens: &s.tokens,
                num_prompt_tokens: s.num_prompt_tokens,
                num_computed_tokens: s.num_computed_tokens,
                num_tokens: row.num_tokens,
                block_table: &s.block_table,
                num_samples_at_end: if s.will_fork() { s.seats as u32 } else { 1 },
            };
            let samples = plan.push_row(&spec, bs, r as i32);
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

    /// The longest confirmed run of cached blocks at the start of `key`'s tokens, leaving at
    /// least the last token to compute.
    fn find_cached_prefix(&mut self, key: SeqKey) -> Vec<BlockId> {
        let bs = self.cfg.block_size;
        let s = self.seqs[key as usize].as_mut().expect("live");
        // Prompt logprobs are computed in prefill: a hit would skip the positions to score.
        if !self.cfg.enable_prefix_caching || s.params.prompt_logprobs.is_some() {
            return Vec::new();
        }
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
}
