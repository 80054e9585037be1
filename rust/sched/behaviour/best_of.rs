//! `best_of` > `n`, sampled (`SamplingParams::ranks_candidates`): the request samples `best_of` candidates like `n`
//! sequences (`sample.rs`: every candidate takes a seat, the prompt forks into all of them) and
//! returns the `n` with the highest cumulative logprob, best first, as sequences `0..n`.
//!
//! The candidates stay hidden until the last of them finishes: each entry a candidate appends is
//! taken back out of the step's output and kept here (the request is listed in
//! `StepOutput::held_req_ids` instead), its KV blocks freed as usual when it ends. When the last
//! one ends, the best `n` are pushed into that step's output whole, every entry of each in
//! order. An abort or deadline ends the request with the best `n` of what exists, the
//! unfinished ones ending with that reason (emitted by the next `update()`).
//!
//! The cumulative logprob is the exactly rounded sum of the sampled tokens' logprobs, which the
//! scheduler computes for these requests even without `logprobs` (as vLLM's
//! `cumulative_logprob`, in the scheduler's `logprobs_mode`); ties go to the lower index, and a
//! NaN sum (tokens given without logits) ranks last. Logprob entries still reach the caller
//! only if it asked for them.

use super::super::core::Scheduler;
use super::super::output::{OutRow, StepOutput};
use super::super::rank::SeqKey;
use super::Behaviour;
use crate::params::SamplingParams;
use crate::types::{FinishReason, RequestId, SeqStatus};

/// The held entries of each candidate of one request.
#[derive(Debug)]
pub(crate) struct Candidates {
    /// Candidates returned.
    n: usize,
    /// Per candidate (by sequence index), its entries so far.
    rows: Vec<Vec<OutRow>>,
}

impl Candidates {
    pub fn new(params: &SamplingParams) -> Self {
        Candidates {
            n: params.n as usize,
            rows: vec![Vec::new(); params.best_of as usize],
        }
    }

    /// The entries of the best `n` candidates, best first, renumbered `0..n`; an unfinished
    /// one ends with `reason`.
    fn ranked(self, reason: Option<FinishReason>) -> Vec<OutRow> {
        let key = |rows: &[OutRow]| {
            let sum = OutRow::sum_logprobs(rows);
            if sum.is_nan() {
                f64::INFINITY
            } else {
                -sum
            }
        };
        let mut order: Vec<(f64, usize)> = self
            .rows
            .iter()
            .enumerate()
            .map(|(i, rows)| (key(rows), i))
            .collect();
        order.sort_by(|a, b| a.0.partial_cmp(&b.0).expect("no NaN").then(a.1.cmp(&b.1)));
        let mut rows = self.rows;
        let mut best = Vec::new();
        for (rank, (_, i)) in order.into_iter().take(self.n).enumerate() {
            let mut candidate = std::mem::take(&mut rows[i]);
            for row in &mut candidate {
                row.entry.seq_index = rank as u32;
            }
            let last = candidate.last_mut().filter(|r| r.entry.finish_reason == 0);
            if let (Some(last), Some(reason)) = (last, reason) {
                last.entry.finish_reason = reason as u8;
            }
            best.extend(candidate);
        }
        best
    }
}

impl Scheduler {
    /// Takes the entry just appended for candidate `key` back out of `out` and keeps it; when
    /// no candidate of its request is left running, pushes the best `n` into `out`.
    pub(super) fn hold_candidate_entry(&mut self, key: SeqKey, out: &mut StepOutput) {
        let row = out.pop_row();
        let (req_id, index) = (self.seq(key).req_id, self.seq(key).seq_index as usize);
        let group = self.group(req_id);
        let done = group
            .seqs
            .iter()
            .all(|&k| self.seq(k).status == SeqStatus::Finished);
        let Behaviour::BestOf(held) = &mut self.group_mut(req_id).behaviour else {
            unreachable!("a best_of request's group holds its candidates");
        };
        held.rows[index].push(row);
        if done {
            let held = std::mem::replace(
                held,
                Box::new(Candidates {
                    n: 0,
                    rows: Vec::new(),
                }),
            );
            for row in held.ranked(None) {
                out.push_row(&row);
            }
            out.held_req_ids.retain(|&id| id != req_id.0);
        } else if !out.held_req_ids.contains(&req_id.0) {
            out.held_req_ids.push(req_id.0);
        }
    }

    /// A `best_of` request ended by an abort or its deadline: the best `n` of its candidates so
    /// far, ending with `reason`, go to the next `update()`. Nothing before the first tokens.
    pub(super) fn show_ended_candidates(&mut self, req_id: RequestId, reason: FinishReason) {
        let Behaviour::BestOf(held) = &mut self.group_mut(req_id).behaviour else {
            unreachable!("a best_of request's group holds its candidates");
        };
        if held.rows.iter().all(Vec::is_empty) {
            return;
        }
        let held = std::mem::replace(
            held,
            Box::new(Candidates {
                n: 0,
                rows: Vec::new(),
            }),
        );
        self.hold_rows(held.ranked(Some(reason)));
    }
}
