//! Scheduling order: the slab key of a sequence, its effective priority under aging, and the
//! rank that orders admission, preemption and running work. A leaf: it depends on nothing else
//! in `sched`.

use std::cmp::Ordering;

/// Index of a sequence in the scheduler's slab.
pub(crate) type SeqKey = u32;

/// The effective priority of a request: `priority` improved by one level per `aging_s` seconds
/// since `arrival`, never better than 1. `aging_s == 0` turns aging off.
pub(crate) fn effective_priority(priority: u8, arrival: f64, now: f64, aging_s: f64) -> u8 {
    if aging_s <= 0.0 || priority <= 1 {
        return priority;
    }
    let levels = ((now - arrival) / aging_s).floor();
    if levels >= f64::from(priority - 1) {
        1
    } else if levels >= 1.0 {
        priority - levels as u8
    } else {
        priority
    }
}

/// Scheduling order: better effective priority first, then earlier arrival, then ids.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rank {
    pub priority: u8,
    pub arrival: f64,
    pub req_id: u64,
    pub seq_index: u32,
}

impl Rank {
    /// Total order: lower is better (scheduled first, preempted last).
    pub fn cmp(&self, other: &Rank) -> Ordering {
        self.priority
            .cmp(&other.priority)
            .then(self.arrival.total_cmp(&other.arrival))
            .then(self.req_id.cmp(&other.req_id))
            .then(self.seq_index.cmp(&other.seq_index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aging_gains_one_level_per_interval_and_stops_at_one() {
        assert_eq!(effective_priority(5, 0.0, 9.9, 10.0), 5);
        assert_eq!(effective_priority(5, 0.0, 10.0, 10.0), 4);
        assert_eq!(effective_priority(5, 0.0, 35.0, 10.0), 2);
        assert_eq!(effective_priority(5, 0.0, 1e9, 10.0), 1);
        assert_eq!(effective_priority(3, 0.0, 1e9, 0.0), 3);
        assert_eq!(effective_priority(1, 0.0, 1e9, 10.0), 1);
        // A clock that went backwards never makes a request worse.
        assert_eq!(effective_priority(4, 100.0, 0.0, 10.0), 4);
    }
}
