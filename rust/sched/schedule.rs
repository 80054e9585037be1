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
        if self.cfg.prefill_only {
            self.admit_prefill(now, &mut budget, &mut rows);
            return self.materialize(rows, plan);
        }
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
                // A beam group's first row yields one sample: the beams come from its logits.
                // Prefill-only rows sample nothing (`prefill`).
                num_samples_at_end: match s.will_fork() && !s.params.use_beam_search {
                    _ if self.cfg.prefill_only => 0,
                    true => s.seats as u32,
                    false => 1,
                },
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
            let s = self.seq(key);
            if s.beam.is_some() && s.num_computed_tokens + 1 == s.tokens.len() {
                match self.schedule_beam_group(i, budget, rows, plan, &mut preempted) {
                    Some(skip) => i += skip,
                    None => break,
                }
                continue;
            }
            let num_tokens = (s.compute_target() - s.num_computed_tokens).min(*budget);
            if num_tokens == 0 {
                i += 1;
                continue;
            }
            if !self.schedule_row(key, num_tokens, budget, rows, plan, &mut preempted) {
                break;
            }
            i += 1;
        }
        preempted
    }

    /// Gives `key` a row of `num_tokens`, preempting the worst-ranked running work (possibly
    /// `key` itself, with its beam group) while blocks are short. Returns false when `key` was
    /// preempted: everything after it in `running` is gone too.
    fn schedule_row(
        &mut self,
        key: SeqKey,
        num_tokens: usize,
        budget: &mut usize,
        rows: &mut Vec<Row>,
        plan: &mut StepPlan,
        preempted: &mut bool,
    ) -> bool {
        let copy = loop {
            if let Some(copy) = self.reserve_blocks(key, num_tokens) {
                break copy;
            }
            // Running is sorted, so the last entry is the worst-ranked one (at or after `key`).
            let victim = *self.running.last().expect("`key` itself is running");
            self.preempt(victim, rows, budget, plan);
            *preempted = true;
            if self.seq(key).status != SeqStatus::Running {
                return false;
            }
        };
        rows.push(Row {
            key,
            num_tokens,
            copy,
        });
        *budget -= num_tokens;
        true
    }

    /// The beam at `running[i]` has computed all but its last token. When every beam of its
    /// group has too (they are contiguous in `running`), the group gets one decode row per beam,
    /// all in this step; otherwise this beam waits. Returns how many entries of `running` to
    /// move past, or None when the group was preempted (it was the worst-ranked work).
    fn schedule_beam_group(
        &mut self,
        i: usize,
        budget: &mut usize,
        rows: &mut Vec<Row>,
        plan: &mut StepPlan,
        preempted: &mut bool,
    ) -> Option<usize> {
        let req_id = self.seq(self.running[i]).req_id;
        let members = self.requests[&req_id].seqs.clone();
        let ready = members.iter().all(|&k| {
            let s = self.seq(k);
            s.status == SeqStatus::Running && s.num_computed_tokens + 1 == s.tokens.len()
        });
        if !ready {
            return Some(1);
        }
        let group: Vec<SeqKey> = self.running[i..i + members.len()].to_vec();
        debug_assert!(
            group.iter().all(|k| members.contains(k)),
            "beams are contiguous"
        );
        if *budget < group.len() {
            return Some(group.len());
        }
        for key in group.iter().copied() {
            if !self.schedule_row(key, 1, budget, rows, plan, preempted) {
                return None;
            }
        }
        Some(group.len())
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
            // A preempted beam group comes back whole: every beam at once, each with the
            // blocks for its whole recompute, so that no beam waits on another for blocks.
            let keys = match self.seq(key).beam.is_some() {
                true => self.waiting_beams(key),
                false => vec![key],
            };
            let whole = keys.len() > 1 || self.seq(key).beam.is_some();
            let hits: Vec<Vec<BlockId>> =
                keys.iter().map(|&k| self.find_cached_prefix(k)).collect();
            loop {
                let seats: usize = keys.iter().map(|&k| self.seq(k).seats).sum();
                let seats_ok = self.num_running_seats + seats <= self.cfg.max_num_seqs;
                let blocks: usize = keys
                    .iter()
                    .zip(&hits)
                    .map(|(&k, h)| {
                        self.blocks_to_admit(k, h, if whole { usize::MAX } else { *budget })
                    })
                    .sum();
                if seats_ok && self.pool.num_free() >= blocks {
                    break;
                }
                if !self.preempt_worse_than(rank, now, rows, budget, plan) {
                    return;
                }
            }
            for (&key, hits) in keys.iter().zip(&hits) {
                let num_tokens = self.admit(key, hits, *budget, whole);
                if num_tokens > 0 {
                    rows.push(Row {
                        key,
                        num_tokens,
                        copy: None,
                    });
                }
                *budget -= num_tokens;
            }
        }
    }

    /// The waiting beams of `key`'s group (all of them: a group is preempted whole).
    fn waiting_beams(&self, key: SeqKey) -> Vec<SeqKey> {
        let req_id = self.seq(key).req_id;
        let mut keys: Vec<SeqKey> = self.requests[&req_id]
            .seqs
            .iter()
            .copied()
            .filter(|&k| self.seq(k).status != SeqStatus::Running)
            .collect();
        keys.sort_by_key(|&k| self.seq(k).seq_index);
        keys
    }

    /// Blocks that admitting `key` with prefix `hits` takes from the free list, computing at
    /// most `budget` tokens now (`usize::MAX`: everything up to its compute target).
    fn blocks_to_admit(&self, key: SeqKey, hits: &[BlockId], budget: usize) -> usize {
        let s = self.seq(key);
        let num_cached = (hits.len() * self.cfg.block_size).min(s.compute_target());
        let end = num_cached + (s.compute_target() - num_cached).min(budget);
        let revived = hits
            .iter()
            .filter(|&&b| self.pool.ref_count(b) == 0)
            .count();
        end.div_ceil(self.cfg.block_size) - hits.len() + revived
    }

    /// Admits `key` with prefix `hits`: the row's token count this step (at most `budget`;
    /// 0 = no row). `whole` reserves the blocks for everything up to its compute target.
    pub(crate) fn admit(
        &mut self,
        key: SeqKey,
        hits: &[BlockId],
        budget: usize,
        whole: bool,
    ) -> usize {
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
        let target = s.compute_target();
        let num_tokens = (target - s.num_computed_tokens).min(budget);
        let end = match whole {
            true => target,
            false => s.num_computed_tokens + num_tokens,
        };
        let ok = self.pool.allocate_into(
            end.div_ceil(bs).saturating_sub(hits.len()),
            &mut s.block_table,
        );
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
