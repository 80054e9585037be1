//! The waiting queue: one FIFO per priority level. The best sequence is the best-ranked among
//! the five queue heads, so aging costs five comparisons, not a re-sort.

use std::collections::VecDeque;

use super::rank::{effective_priority, Rank, SeqKey};

/// Number of priority levels (1 = highest .. 5 = lowest, the default).
pub(crate) const NUM_PRIORITIES: usize = 5;

#[derive(Debug, Clone, Copy)]
struct Entry {
    key: SeqKey,
    arrival: f64,
    req_id: u64,
    seq_index: u32,
}

/// Waiting sequences by priority, each level in arrival order (preempted ones at the front).
#[derive(Debug, Default)]
pub(crate) struct WaitingQueue {
    levels: [VecDeque<Entry>; NUM_PRIORITIES],
    len: usize,
}

impl WaitingQueue {
    pub fn len(&self) -> usize {
        self.len
    }

    /// Queues a new sequence behind every sequence of its level that arrived no later.
    pub fn push_back(&mut self, key: SeqKey, priority: u8, arrival: f64, req_id: u64, seq: u32) {
        let level = &mut self.levels[usize::from(priority - 1)];
        let at = level.partition_point(|e| e.arrival <= arrival);
        let entry = Entry {
            key,
            arrival,
            req_id,
            seq_index: seq,
        };
        if at == level.len() {
            level.push_back(entry);
        } else {
            level.insert(at, entry);
        }
        self.len += 1;
    }

    /// Puts a preempted sequence at the front of its level.
    pub fn push_front(&mut self, key: SeqKey, priority: u8, arrival: f64, req_id: u64, seq: u32) {
        self.levels[usize::from(priority - 1)].push_front(Entry {
            key,
            arrival,
            req_id,
            seq_index: seq,
        });
        self.len += 1;
    }

    /// The best waiting sequence and its rank at `now`, without removing it.
    pub fn peek(&self, now: f64, aging_s: f64) -> Option<(SeqKey, Rank)> {
        self.best_head(&[0; NUM_PRIORITIES], now, aging_s)
            .map(|(_, key, rank)| (key, rank))
    }

    /// The ids of the waiting requests in the order their sequences would be admitted at `now`
    /// (each request once, where its first sequence stands): the heads of the levels merged
    /// by rank, as `peek` picks them one after another.
    pub fn admission_order(&self, now: f64, aging_s: f64) -> Vec<u64> {
        let mut heads = [0; NUM_PRIORITIES];
        let mut order = Vec::new();
        let mut seen = std::collections::HashSet::new();
        while let Some((level, _, rank)) = self.best_head(&heads, now, aging_s) {
            heads[level] += 1;
            if seen.insert(rank.req_id) {
                order.push(rank.req_id);
            }
        }
        order
    }

    /// The best-ranked of the entries at `heads` (an index into each level) at `now`: its
    /// level, key and rank.
    fn best_head(
        &self,
        heads: &[usize; NUM_PRIORITIES],
        now: f64,
        aging_s: f64,
    ) -> Option<(usize, SeqKey, Rank)> {
        let mut best: Option<(usize, SeqKey, Rank)> = None;
        for (i, level) in self.levels.iter().enumerate() {
            let Some(e) = level.get(heads[i]) else {
                continue;
            };
            let rank = Rank {
                priority: effective_priority(i as u8 + 1, e.arrival, now, aging_s),
                arrival: e.arrival,
                req_id: e.req_id,
                seq_index: e.seq_index,
            };
            if best.is_none_or(|(_, _, b)| rank.cmp(&b).is_lt()) {
                best = Some((i, e.key, rank));
            }
        }
        best
    }

    /// Removes the head of `priority`'s level, which must be `key`.
    pub fn pop(&mut self, key: SeqKey, priority: u8) {
        let popped = self.levels[usize::from(priority - 1)].pop_front();
        debug_assert_eq!(popped.map(|e| e.key), Some(key));
        self.len -= 1;
    }

    /// Drops every sequence for which `keep` is false.
    pub fn retain(&mut self, mut keep: impl FnMut(SeqKey) -> bool) {
        for level in &mut self.levels {
            level.retain(|e| keep(e.key));
        }
        self.len = self.levels.iter().map(VecDeque::len).sum();
    }

    /// Every waiting sequence, level by level, front to back.
    pub fn iter(&self) -> impl Iterator<Item = SeqKey> + '_ {
        self.levels.iter().flat_map(|l| l.iter().map(|e| e.key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_then_arrival_and_aging_lets_old_low_priority_win() {
        let mut q = WaitingQueue::default();
        q.push_back(0, 5, 0.0, 0, 0);
        q.push_back(1, 1, 50.0, 1, 0);
        q.push_back(2, 1, 40.0, 2, 0);
        assert_eq!(
            q.peek(50.0, 0.0).unwrap().0,
            2,
            "priority 1, earliest arrival"
        );
        // After 40 s with 10 s aging, the priority-5 request ranks as 1 and arrived first.
        assert_eq!(q.peek(50.0, 10.0).unwrap().0, 0);
        q.pop(2, 1);
        q.push_front(3, 1, 60.0, 3, 0);
        assert_eq!(
            q.peek(50.0, 0.0).unwrap().0,
            3,
            "preempted goes to the front"
        );
        assert_eq!(q.admission_order(50.0, 0.0), vec![3, 1, 0]);
        // Aged to priority 1, request 0 arrived before the preempted request 3.
        assert_eq!(q.admission_order(50.0, 10.0), vec![0, 3, 1]);
        q.retain(|k| k != 3);
        assert_eq!(q.len(), 2);
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![1, 0]);
    }
}
