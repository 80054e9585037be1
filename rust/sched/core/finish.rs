//! How requests end outside `update()`'s token path: aborts and deadlines (at the next
//! `schedule()`), failures of one request's sample, and the bookkeeping every end shares
//! (`finish_seq` frees blocks and seats, `drop_finished` clears the slab and the queues).

use super::Scheduler;
use crate::sched::plan::StepPlan;
use crate::sched::rank::SeqKey;
use crate::types::{FinishReason, RequestId, SeqStatus};

impl Scheduler {
    /// Ends aborted requests and those past their deadline, freeing their blocks. A behaviour
    /// may keep what such a request found so far, for the next `update()` to emit.
    pub(super) fn end_aborted_and_expired(&mut self, now: f64, plan: &mut StepPlan) {
        let deadlines = self.groups.iter().map(|(&id, g)| (id, g.deadline));
        let ended = self.endings.due(now, deadlines);
        if ended.is_empty() {
            return;
        }
        for &(id, reason) in &ended {
            self.on_request_end(id, reason);
            let keys = self.groups[&id].seqs.clone();
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
    pub(super) fn drop_finished(&mut self) -> Vec<RequestId> {
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
            let s = self
                .seqs
                .remove(k)
                .expect("finished sequence is in the slab");
            let group = self.group_mut(s.req_id);
            group.seqs.retain(|&x| x != k);
            if group.seqs.is_empty() {
                let req = self.groups.remove(&s.req_id).expect("present");
                self.endings.removed(s.req_id, req.deadline);
                done.push(s.req_id);
            }
        }
        done
    }

    /// Ends every sequence of `req_id` with [`FinishReason::Error`], freeing its blocks;
    /// `drop_finished` then clears it out.
    pub(super) fn fail_request(&mut self, req_id: RequestId) {
        let keys = self.groups[&req_id].seqs.clone();
        for key in keys {
            self.finish_seq(key, FinishReason::Error);
        }
    }
}
