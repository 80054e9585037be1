//! Changing a group's sequences: a request's first sequence forking into several that share its
//! blocks, and a group's live sequences replaced by new ones made from them (copies sharing
//! their parents' blocks, so nothing is recomputed and only a partial last block is ever copied,
//! on its next write).

use super::Scheduler;
use crate::sched::rank::SeqKey;
use crate::sched::seq::Sequence;
use crate::types::{FinishReason, RequestId, SeqStatus};

impl Scheduler {
    /// Splits a request's first sequence into `n`: the children (indices `1..n`, appended to
    /// `keys`) share every block (refcounts go up), running from the next step on.
    pub(crate) fn fork(&mut self, key: SeqKey, n: usize, keys: &mut Vec<SeqKey>) {
        let parent = self.seqs[key as usize].as_mut().expect("live");
        parent.seats = 1;
        let template = parent.clone();
        for &b in &template.block_table {
            for _ in 1..n {
                self.pool.incref(b);
            }
        }
        for j in 1..n {
            let child = self.insert_seq(Sequence {
                seq_index: j as u32,
                ..template.clone()
            });
            self.running.push(child);
            self.group_mut(template.req_id).seqs.push(child);
            keys.push(child);
        }
    }

    /// A copy of live sequence `key` that shares its blocks (their refcounts go up), for
    /// [`Scheduler::replace_seqs`].
    pub(crate) fn clone_shared(&mut self, key: SeqKey) -> Sequence {
        let s = self.seq(key).clone();
        for &b in &s.block_table {
            self.pool.incref(b);
        }
        s
    }

    /// The running sequences `members` of `req_id` become `next`, in order: each new sequence
    /// takes a member's place, once every member's blocks and seat are released; members left
    /// over end (reason stop); new sequences left over join the group, running. Each new
    /// sequence holds one seat.
    pub(crate) fn replace_seqs(
        &mut self,
        req_id: RequestId,
        members: &[SeqKey],
        next: Vec<Sequence>,
    ) {
        for &key in members {
            let s = self.seqs[key as usize].as_mut().expect("live");
            self.pool.free(&s.block_table);
            s.block_table.clear();
            self.num_running_seats -= s.seats;
        }
        let mut next = next.into_iter();
        for &key in members {
            match next.next() {
                Some(seq) => {
                    self.seqs[key as usize] = Some(seq);
                    self.num_running_seats += 1;
                }
                None => {
                    let s = self.seqs[key as usize].as_mut().expect("live");
                    s.status = SeqStatus::Finished;
                    s.finish = Some(FinishReason::Stop);
                    self.just_finished.push(key);
                }
            }
        }
        for seq in next {
            let key = self.insert_seq(seq);
            self.running.push(key);
            self.num_running_seats += 1;
            self.group_mut(req_id).seqs.push(key);
        }
    }
}
