//! Requests to end at the next `schedule()`, for either scheduler: the aborts asked for, and
//! the deadlines of the requests queued (counted, so that a step without any looks at none).

use crate::types::{FinishReason, RequestId};

/// Aborts asked for and deadlines to watch.
#[derive(Debug, Default)]
pub(crate) struct Endings {
    aborts: Vec<RequestId>,
    num_deadlines: usize,
}

impl Endings {
    /// Asks for the abort of `req_id`, an unfinished request; false if it was asked already.
    pub fn abort(&mut self, req_id: RequestId) -> bool {
        if self.aborts.contains(&req_id) {
            return false;
        }
        self.aborts.push(req_id);
        true
    }

    /// A request with `deadline` was queued.
    pub fn added(&mut self, deadline: Option<f64>) {
        self.num_deadlines += usize::from(deadline.is_some());
    }

    /// The request `req_id`, with `deadline`, is gone (an abort asked for it is dropped).
    pub fn removed(&mut self, req_id: RequestId, deadline: Option<f64>) {
        self.num_deadlines -= usize::from(deadline.is_some());
        self.aborts.retain(|&id| id != req_id);
    }

    /// The requests to end at `now`, each once: the aborts asked for, then those of `deadlines`
    /// (every unfinished request's id and deadline) that have passed.
    pub fn due(
        &mut self,
        now: f64,
        deadlines: impl Iterator<Item = (RequestId, Option<f64>)>,
    ) -> Vec<(RequestId, FinishReason)> {
        let mut ended: Vec<(RequestId, FinishReason)> = self
            .aborts
            .drain(..)
            .map(|id| (id, FinishReason::Abort))
            .collect();
        if self.num_deadlines > 0 {
            for (id, deadline) in deadlines {
                if deadline.is_some_and(|d| d <= now) && !ended.iter().any(|e| e.0 == id) {
                    ended.push((id, FinishReason::Timeout));
                }
            }
        }
        ended
    }
}
