//! `Scheduler::update()` / `update_with_logits()`: apply one step's tokens, given by the caller
//! or drawn from the step's logits by the requests' behaviours. Each row advances its computed
//! tokens (offering newly full blocks to the prefix cache) and its behaviour applies its samples
//! (forks, appended tokens with their stops and text); then what the behaviours finish for the
//! step, entries held for this output, failures and finished requests. A sample that could not
//! be drawn fails its request alone (`StepOutput::failed_req_ids`).

use super::{PlanRecord, Scheduler};
use crate::error::{CoreError, CoreResult};
use crate::sampling::{SampleResult, Sampled};
use crate::sched::behaviour::StepEdges;
use crate::sched::output::StepOutput;
use crate::types::{RequestId, TokenId};

/// The tokens of one step: given by the caller, or drawn from the step's logits (where a
/// sample may have failed, or be left undrawn: `None`, for positions a behaviour handles itself
/// or discards).
pub(crate) enum Samples<'a> {
    Given(&'a [TokenId]),
    Drawn(Vec<Option<SampleResult>>),
}

impl Samples<'_> {
    /// The token of sample `i`, which must be there and not have failed.
    pub fn token(&self, i: usize) -> TokenId {
        match self {
            Samples::Given(t) => t[i],
            Samples::Drawn(d) => {
                let drawn = d[i].as_ref().expect("an applied sample is drawn");
                drawn.as_ref().expect("failed samples are skipped").token
            }
        }
    }

    /// The token of sample `i`, if it was drawn and did not fail.
    pub fn token_at(&self, i: usize) -> Option<TokenId> {
        match self {
            Samples::Given(t) => t.get(i).copied(),
            Samples::Drawn(d) => d.get(i)?.as_ref()?.as_ref().ok().map(|s| s.token),
        }
    }

    /// Sample `i` as drawn (with its logprobs), if it was.
    pub fn drawn(&self, i: usize) -> Option<&Sampled> {
        match self {
            Samples::Given(_) => None,
            Samples::Drawn(d) => d[i].as_ref().and_then(|r| r.as_ref().ok()),
        }
    }

    /// Why sample `i` could not be drawn, if it could not.
    pub fn error(&self, i: usize) -> Option<&CoreError> {
        match self {
            Samples::Given(_) => None,
            Samples::Drawn(d) => d[i].as_ref().and_then(|r| r.as_ref().err()),
        }
    }

    fn num_top_logprobs(&self) -> usize {
        match self {
            Samples::Given(_) => 0,
            Samples::Drawn(d) => d
                .iter()
                .flatten()
                .flatten()
                .map(|s| s.top_logprobs.len())
                .max()
                .unwrap_or(0),
        }
    }
}

impl Scheduler {
    /// Applies the tokens sampled for the plan of step `step_id`, one per sample in plan order.
    /// Fails, changing nothing, if the plan is not the last one, the count is wrong or a
    /// behaviour of the step chooses its tokens from the logits itself.
    pub fn update(
        &mut self,
        step_id: u64,
        sampled_token_ids: &[TokenId],
    ) -> CoreResult<StepOutput> {
        let rec = self.take_plan(step_id)?;
        if sampled_token_ids.len() != rec.total_samples {
            let expected = rec.total_samples;
            self.last = Some(rec);
            return Err(CoreError::invalid(
                "sampled_token_ids",
                "wrong_length",
                format!(
                    "`sampled_token_ids` must have one token per sample of the plan ({expected}); got {}",
                    sampled_token_ids.len()
                ),
            ));
        }
        if let Err(e) = self.check_given(&rec) {
            self.last = Some(rec);
            return Err(e);
        }
        let samples = Samples::Given(sampled_token_ids);
        Ok(self.apply(&rec, &samples, StepEdges::default()))
    }

    /// Samples every row of the step from `logits` (row-major `[num_samples, vocab]`, row `i`
    /// for sample `i` of the plan) and applies the tokens like [`Scheduler::update`]. Rows are
    /// drawn in parallel; each sequence's draw depends only on its own seed, sample index and
    /// position. Fails, changing nothing, on a stale plan or a logits shape that does not match.
    /// A sample that cannot be drawn (its parameters do not fit the row, or no finite logit is
    /// left after its processors) fails its request alone: see `StepOutput::failed_req_ids`.
    pub fn update_with_logits(
        &mut self,
        step_id: u64,
        logits: &[f32],
        vocab: usize,
    ) -> CoreResult<StepOutput> {
        let rec = self.take_plan(step_id)?;
        let expected = rec.total_samples * vocab;
        if vocab == 0 || logits.len() != expected {
            let rows = rec.total_samples;
            self.last = Some(rec);
            return Err(CoreError::invalid(
                "logits",
                "wrong_shape",
                format!(
                    "`logits` must be [num_samples ({rows}), vocab] with vocab > 0; got {} values for vocab {vocab}",
                    logits.len()
                ),
            ));
        }
        match self.draw(&rec, logits, vocab) {
            Ok((samples, edges)) => Ok(self.apply(&rec, &samples, edges)),
            Err(e) => {
                self.last = Some(rec);
                Err(e)
            }
        }
    }

    /// Takes the record of the plan `step_id`, which must be the last one `schedule()` returned.
    fn take_plan(&mut self, step_id: u64) -> CoreResult<PlanRecord> {
        match self.last.take() {
            Some(rec) if rec.step_id == step_id => Ok(rec),
            other => {
                self.last = other;
                Err(CoreError::StalePlan {
                    got: step_id,
                    expected: self.last.as_ref().map_or(self.step + 1, |r| r.step_id),
                })
            }
        }
    }

    fn apply(&mut self, rec: &PlanRecord, samples: &Samples<'_>, edges: StepEdges) -> StepOutput {
        let mut out = StepOutput::with_width(samples.num_top_logprobs());
        let mut failed = self.failed_requests(rec, samples);
        for (req_id, error) in edges.failures() {
            if !failed.iter().any(|(id, _)| *id == req_id) {
                failed.push((req_id, error));
            }
        }
        let mut next = 0;
        for (row, &num_samples) in rec.rows.iter().zip(&rec.num_samples) {
            let first = next;
            next += num_samples as usize;
            let req_id = self.seq(row.key).req_id;
            let ok = !failed.iter().any(|(id, _)| *id == req_id);
            self.apply_row(row, first..next, samples, ok, &mut out);
        }
        self.finish_step(edges, &mut out);
        for row in std::mem::take(&mut self.held_rows) {
            out.push_row(&row);
        }
        for (req_id, error) in failed {
            self.fail_request(req_id);
            out.failed_req_ids.push(req_id.0);
            out.failed_errors.push(error);
        }
        let done = self.drop_finished();
        let failed_ids = &out.failed_req_ids;
        out.finished_req_ids = done
            .into_iter()
            .map(|id| id.0)
            .filter(|id| !failed_ids.contains(id))
            .collect();
        out
    }

    /// The requests with a sample that failed in this step, each once with its first error.
    fn failed_requests(
        &self,
        rec: &PlanRecord,
        samples: &Samples<'_>,
    ) -> Vec<(RequestId, CoreError)> {
        let mut failed: Vec<(RequestId, CoreError)> = Vec::new();
        let mut next = 0;
        for (row, &num_samples) in rec.rows.iter().zip(&rec.num_samples) {
            let range = next..next + num_samples as usize;
            next = range.end;
            let Some(err) = range.into_iter().find_map(|i| samples.error(i)) else {
                continue;
            };
            let req_id = self.seq(row.key).req_id;
            if !failed.iter().any(|(id, _)| *id == req_id) {
                failed.push((req_id, err.clone()));
            }
        }
        failed
    }
}
