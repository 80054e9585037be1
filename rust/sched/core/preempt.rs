//! Preemption by recompute: the victim frees its blocks, leaves this step's rows (its token
//! and encoder budget refunded) and goes back to the front of its priority's queue.

use super::{Row, Scheduler};
use crate::sched::plan::StepPlan;
use crate::sched::rank::{Rank, SeqKey};
use crate::types::SeqStatus;

impl Scheduler {
    /// Preempts a running sequence by recompute: frees its blocks, drops its row from this step
    /// if it had one (refunding the budget), and queues it at the front of its priority. A gang
    /// member takes its whole gang with it (a gang samples together or not at all).
    pub(super) fn preempt(
        &mut self,
        key: SeqKey,
        rows: &mut Vec<Row>,
        budget: &mut usize,
        plan: &mut StepPlan,
    ) {
        if !self.seq(key).gang {
            return self.preempt_one(key, rows, budget, plan);
        }
        let req_id = self.seq(key).req_id;
        let mut gang: Vec<SeqKey> = self.groups[&req_id].seqs.clone();
        gang.retain(|&k| self.seq(k).status == SeqStatus::Running);
        // Queued from the last member to the first, so the first ends up in front.
        gang.sort_by_key(|&k| std::cmp::Reverse(self.seq(k).seq_index));
        for k in gang {
            self.preempt_one(k, rows, budget, plan);
        }
    }

    fn preempt_one(
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
            let row = rows.remove(r);
            *budget += row.num_tokens;
            self.encoder.refund(row.num_encoder_tokens);
        }
        let s = self.seqs[key as usize].as_mut().expect("live");
        self.pool.free(&s.block_table);
        s.block_table.clear();
        s.num_computed_tokens = 0;
        s.num_cached_blocks = 0;
        s.num_encoded_spans = 0;
        s.status = SeqStatus::Preempted;
        self.num_running_seats -= s.seats;
        self.waiting
            .push_front(key, s.priority, s.arrival, s.req_id.0, s.seq_index);
        plan.preempted_req_ids.push(s.req_id.0);
        plan.preempted_seq_indices.push(s.seq_index);
        self.num_preemptions += 1;
    }

    /// Preempts the worst-ranked running sequence if its effective priority is strictly worse
    /// than `rank`'s. Returns whether it did.
    pub(super) fn preempt_worse_than(
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
}
