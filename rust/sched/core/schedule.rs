//! `schedule()`: one token budget per step, spent on running sequences first (best rank first;
//! a sequence short of blocks preempts the worst-ranked running one), then on admitting waiting
//! sequences in rank order, reusing prefix-cached blocks. A gang (a group whose sequences sample
//! together) gets its rows all in one step or none, and is admitted whole.

use super::encoder::EncoderBudget;
use super::Scheduler;
use crate::sched::plan::{RowSpec, StepPlan};
use crate::sched::rank::SeqKey;
use crate::types::{BlockId, SeqStatus, TokenId};

/// One scheduled sequence: `num_tokens` tokens from its `num_computed_tokens` on, the last
/// `lookahead.len()` of them tentative tokens a behaviour added (see `Scheduler::extend_row`).
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub key: SeqKey,
    pub num_tokens: usize,
    /// Tentative tokens computed after the row's own tokens: each position is sampled, and
    /// `update()` keeps only what the samples confirm.
    pub lookahead: Vec<TokenId>,
    /// Copy-on-write done for this row before its KV is written: (source, destination).
    pub copy: Option<(BlockId, BlockId)>,
    /// Encoder tokens (media spans) this row starts.
    pub num_encoder_tokens: usize,
}

impl Row {
    fn new(key: SeqKey, num_tokens: usize) -> Self {
        Row {
            key,
            num_tokens,
            lookahead: Vec::new(),
            copy: None,
            num_encoder_tokens: 0,
        }
    }
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
        let mut plan = StepPlan::new(self.step);
        self.end_aborted_and_expired(now, &mut plan);
        let mut rows = Vec::new();
        let mut budget = self.cfg.max_num_batched_tokens;
        self.encoder = EncoderBudget::new(self.cfg.max_num_encoder_tokens);
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
        plan.num_encoder_tokens = self.encoder.num_scheduled;
        for (r, row) in rows.iter().enumerate() {
            let s = self.seq(row.key);
            let spec = RowSpec {
                req_id: s.req_id,
                seq_index: s.seq_index,
                tokens: &s.tokens,
                num_prompt_tokens: s.num_prompt_tokens,
                num_computed_tokens: s.num_computed_tokens,
                num_tokens: row.num_tokens - row.lookahead.len(),
                lookahead: &row.lookahead,
                block_table: &s.block_table,
                num_samples_at_end: self.samples_at_end(s),
                lora_id: s.lora_id,
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
            if s.gang && s.num_computed_tokens + 1 == s.tokens.len() {
                match self.schedule_gang(i, budget, rows, plan, &mut preempted) {
                    Some(skip) => i += skip,
                    None => break,
                }
                continue;
            }
            let num_tokens = (s.compute_target() - s.num_computed_tokens).min(*budget);
            let num_tokens = self.encoder_limit(key, s.num_computed_tokens, num_tokens);
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

    /// Gives `key` a row of `num_tokens`: with the tentative tokens its behaviour adds when the
    /// blocks for all of them are free (those never preempt anything), else alone, preempting
    /// the worst-ranked running work (possibly `key` itself, with its gang) while blocks are
    /// short. Returns false when `key` was preempted: everything after it in `running` is gone
    /// too.
    fn schedule_row(
        &mut self,
        key: SeqKey,
        num_tokens: usize,
        budget: &mut usize,
        rows: &mut Vec<Row>,
        plan: &mut StepPlan,
        preempted: &mut bool,
    ) -> bool {
        let mut row = Row::new(key, num_tokens);
        if !self.extend_row(&mut row, *budget - num_tokens) {
            row.copy = loop {
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
        }
        row.num_encoder_tokens = self.spend_encoder(key, num_tokens);
        *budget -= row.num_tokens;
        rows.push(row);
        true
    }

    /// The gang member at `running[i]` has computed all but its last token. When every member
    /// has too (they are contiguous in `running`), the gang gets one decode row per member, all
    /// in this step; otherwise this member waits. Returns how many entries of `running` to move
    /// past, or None when the gang was preempted (it was the worst-ranked work).
    fn schedule_gang(
        &mut self,
        i: usize,
        budget: &mut usize,
        rows: &mut Vec<Row>,
        plan: &mut StepPlan,
        preempted: &mut bool,
    ) -> Option<usize> {
        let req_id = self.seq(self.running[i]).req_id;
        let members = self.groups[&req_id].seqs.clone();
        let ready = members.iter().all(|&k| {
            let s = self.seq(k);
            s.status == SeqStatus::Running && s.num_computed_tokens + 1 == s.tokens.len()
        });
        if !ready {
            return Some(1);
        }
        let gang: Vec<SeqKey> = self.running[i..i + members.len()].to_vec();
        debug_assert!(
            gang.iter().all(|k| members.contains(k)),
            "a gang is contiguous in running"
        );
        if *budget < gang.len() {
            return Some(gang.len());
        }
        for key in gang.iter().copied() {
            if !self.schedule_row(key, 1, budget, rows, plan, preempted) {
                return None;
            }
        }
        Some(gang.len())
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
            // A preempted gang comes back whole: every member at once, each with the blocks
            // for its whole recompute, so that no member waits on another for blocks.
            let gang = self.seq(key).gang;
            let keys = match gang {
                true => self.waiting_members(key),
                false => vec![key],
            };
            if !self.lora_fits(key) {
                break; // no overtaking: it waits for a running adapter to finish
            }
            let hits: Vec<Vec<BlockId>> =
                keys.iter().map(|&k| self.find_cached_prefix(k)).collect();
            // What the encoder budget lets each compute now (a gang reserves its blocks whole
            // anyway, so a member cut to 0 just gets no row this step).
            let bs = self.cfg.block_size;
            let starts: Vec<(SeqKey, usize)> = keys
                .iter()
                .zip(&hits)
                .map(|(&k, h)| (k, h.len() * bs))
                .collect();
            let limits = self.encoder_limits(&starts, *budget);
            if !gang && limits[0] == 0 {
                break; // no overtaking: it starts its media in a later step
            }
            loop {
                let seats: usize = keys.iter().map(|&k| self.seq(k).seats).sum();
                let seats_ok = self.num_running_seats + seats <= self.cfg.max_num_seqs;
                let blocks: usize = keys
                    .iter()
                    .zip(&hits)
                    .zip(&limits)
                    .map(|((&k, h), &limit)| {
                        self.blocks_to_admit(k, h, if gang { usize::MAX } else { limit })
                    })
                    .sum();
                if seats_ok && self.pool.num_free() >= blocks {
                    break;
                }
                if !self.preempt_worse_than(rank, now, rows, budget, plan) {
                    return;
                }
            }
            for ((&key, hits), &limit) in keys.iter().zip(&hits).zip(&limits) {
                let num_tokens = self.admit(key, hits, limit.min(*budget), gang);
                if num_tokens > 0 {
                    let mut row = Row::new(key, num_tokens);
                    row.num_encoder_tokens = self.spend_encoder(key, num_tokens);
                    self.extend_row(&mut row, *budget - num_tokens);
                    *budget -= row.num_tokens;
                    rows.push(row);
                }
            }
        }
    }

    /// Whether `key` may run beside the running sequences: its adapter is the base model, or
    /// already running, or fewer than `max_loras` distinct adapters run (0: no limit).
    fn lora_fits(&self, key: SeqKey) -> bool {
        let (lora, max) = (self.seq(key).lora_id, self.cfg.max_loras);
        if lora == 0 || max == 0 {
            return true;
        }
        let mut running: Vec<u32> = self
            .running
            .iter()
            .map(|&k| self.seq(k).lora_id)
            .filter(|&id| id != 0)
            .collect();
        running.sort_unstable();
        running.dedup();
        running.contains(&lora) || running.len() < max
    }

    /// The waiting members of `key`'s gang (all of them: a gang is preempted whole).
    fn waiting_members(&self, key: SeqKey) -> Vec<SeqKey> {
        let req_id = self.seq(key).req_id;
        let mut keys: Vec<SeqKey> = self.groups[&req_id]
            .seqs
            .iter()
            .copied()
            .filter(|&k| self.seq(k).status != SeqStatus::Running)
            .collect();
        keys.sort_by_key(|&k| self.seq(k).seq_index);
        keys
    }
}
