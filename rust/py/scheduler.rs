//! `Scheduler` and `PrefillScheduler` for Python: thin wrappers that extract arguments,
//! release the GIL for work that scales with the batch, and convert results (`StepPlan` /
//! `StepOutput` in step.rs). A new request arrives as one typed `NewRequest` (request.rs); its
//! defaults and checks live in the core.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::arrays::{arr, logits_view};
use super::detok::PyDetokenizer;
use super::errors::{guard, SchedulerError};
use super::request::{request_id_arg, PyNewRequest};
use super::sched_config::PySchedulerConfig;
use super::step::{PyStepOutput, PyStepPlan};
use super::tokens::token_ids;
use crate::error::CoreError;
use crate::error::CoreResult;
use crate::sched::{PrefillScheduler, Scheduler, SchedulerStats, StepOutput, StepPlan};
use crate::types::TokenId;

/// Counters and gauges as the dict `stats()` returns.
fn stats_dict(py: Python<'_>, s: SchedulerStats) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("num_running_seqs", s.num_running_seqs)?;
    d.set_item("num_waiting_seqs", s.num_waiting_seqs)?;
    d.set_item("num_unfinished_requests", s.num_unfinished_requests)?;
    d.set_item("num_free_blocks", s.num_free_blocks)?;
    d.set_item("num_used_blocks", s.num_used_blocks)?;
    d.set_item("num_cached_blocks", s.num_cached_blocks)?;
    d.set_item("num_prefix_queried_blocks", s.num_prefix_queried_blocks)?;
    d.set_item("num_prefix_hit_blocks", s.num_prefix_hit_blocks)?;
    d.set_item("num_preemptions", s.num_preemptions)?;
    d.set_item("num_steps", s.num_steps)?;
    d.set_item("num_draft_tokens", s.num_draft_tokens)?;
    d.set_item("num_accepted_draft_tokens", s.num_accepted_draft_tokens)?;
    Ok(d)
}

/// `schedule()` of either scheduler: at `now`, else the clock's now, with the GIL released.
fn schedule_step<S: Send>(
    py: Python<'_>,
    s: &mut S,
    now: Option<f64>,
    schedule: fn(&mut S, f64) -> StepPlan,
) -> PyResult<PyStepPlan> {
    let t = now.unwrap_or_else(super::request::now);
    let plan = py.detach(|| guard("schedule()", || schedule(s, t)))?;
    PyStepPlan::new(py, plan)
}

/// `update()` of either scheduler: `plan`'s step ended with the sampled `token_ids`, with the
/// GIL released.
fn update_step<S: Send>(
    py: Python<'_>,
    s: &mut S,
    plan: &PyStepPlan,
    token_ids: &Bound<'_, PyAny>,
    update: fn(&mut S, u64, &[TokenId]) -> CoreResult<StepOutput>,
) -> PyResult<PyStepOutput> {
    let step_id = plan.step_id;
    let sampled = self::token_ids("token_ids", token_ids)?;
    let sampled = sampled.as_slice();
    let out = py.detach(|| guard("update()", || update(s, step_id, sampled)))??;
    PyStepOutput::new(py, out)
}

/// A broken invariant as a SchedulerError.
fn invariants(checked: Result<(), String>) -> PyResult<()> {
    checked.map_err(|e| SchedulerError::new_err(format!("invariant broken: {e}")))
}

#[pyclass(name = "Scheduler", module = "ferrollm._core")]
pub struct PyScheduler {
    inner: Scheduler,
    config: Py<PySchedulerConfig>,
}

#[pymethods]
impl PyScheduler {
    #[new]
    #[pyo3(signature = (config, tokenizer=None))]
    fn new(
        config: Bound<'_, PySchedulerConfig>,
        tokenizer: Option<PyRef<'_, PyDetokenizer>>,
    ) -> PyResult<Self> {
        let mut inner = Scheduler::new(config.get().inner.clone())?;
        inner.set_detokenizer(tokenizer.map(|t| t.inner.clone()));
        Ok(PyScheduler {
            inner,
            config: config.unbind(),
        })
    }

    fn add_request(&mut self, request: PyRef<'_, PyNewRequest>) -> PyResult<()> {
        Ok(self.inner.add_request(request.inner.clone())?)
    }

    fn abort_request(&mut self, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(self.inner.abort_request(request_id_arg(request_id)?))
    }

    fn has_unfinished_requests(&self) -> bool {
        self.inner.has_unfinished_requests()
    }

    #[pyo3(signature = (now=None))]
    fn waiting_order(&self, now: Option<f64>) -> Vec<u64> {
        let t = now.unwrap_or_else(super::request::now);
        self.inner
            .waiting_order(t)
            .into_iter()
            .map(|r| r.0)
            .collect()
    }

    #[pyo3(signature = (now=None))]
    fn schedule(&mut self, py: Python<'_>, now: Option<f64>) -> PyResult<PyStepPlan> {
        schedule_step(py, &mut self.inner, now, Scheduler::schedule)
    }

    /// Applies one sampled token id per sample of `plan`.
    fn update(
        &mut self,
        py: Python<'_>,
        plan: PyRef<'_, PyStepPlan>,
        token_ids: &Bound<'_, PyAny>,
    ) -> PyResult<PyStepOutput> {
        update_step(py, &mut self.inner, &plan, token_ids, Scheduler::update)
    }

    /// Samples the step from float32 `logits` `[num_samples, vocab]` (C-contiguous, read in
    /// place) and applies the tokens; a request whose row fails is reported in the output.
    fn update_with_logits(
        &mut self,
        py: Python<'_>,
        plan: PyRef<'_, PyStepPlan>,
        logits: &Bound<'_, PyAny>,
    ) -> PyResult<PyStepOutput> {
        let (step_id, inner) = (plan.step_id, &mut self.inner);
        let (array, vocab) = logits_view(logits)?;
        let flat = array
            .as_slice()
            .map_err(|e| CoreError::invalid("logits", "not_contiguous", e.to_string()))?;
        let out = py.detach(|| {
            guard("update_with_logits()", || {
                inner.update_with_logits(step_id, flat, vocab)
            })
        })??;
        PyStepOutput::new(py, out)
    }

    fn check_invariants(&self) -> PyResult<()> {
        invariants(self.inner.check_invariants())
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, self.inner.stats())
    }

    fn sequences<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.inner
            .sequences()
            .into_iter()
            .map(|v| {
                let d = PyDict::new(py);
                d.set_item("request_id", v.req_id.0)?;
                d.set_item("seq_index", v.seq_index)?;
                d.set_item("priority", v.priority)?;
                d.set_item("arrival_time", v.arrival)?;
                d.set_item("status", format!("{:?}", v.status).to_lowercase())?;
                d.set_item("token_ids", arr(py, v.tokens))?;
                d.set_item("num_prompt_tokens", v.num_prompt_tokens)?;
                d.set_item("num_computed_tokens", v.num_computed_tokens)?;
                let table: Vec<u32> = v.block_table.iter().map(|b| b.0).collect();
                d.set_item("block_table", arr(py, table))?;
                Ok(d)
            })
            .collect()
    }

    /// The configuration this scheduler was built with.
    #[getter]
    fn config(&self, py: Python<'_>) -> Py<PySchedulerConfig> {
        self.config.clone_ref(py)
    }

    #[getter]
    fn block_size(&self) -> usize {
        self.inner.config().block_size
    }

    #[getter]
    fn num_blocks(&self) -> usize {
        self.inner.config().num_blocks
    }

    #[getter]
    fn max_num_seqs(&self) -> usize {
        self.inner.config().max_num_seqs
    }

    #[getter]
    fn max_num_batched_tokens(&self) -> usize {
        self.inner.config().max_num_batched_tokens
    }

    #[getter]
    fn max_model_len(&self) -> usize {
        self.inner.config().max_model_len
    }
}

#[pyclass(name = "PrefillScheduler", module = "ferrollm._core")]
pub struct PyPrefillScheduler {
    inner: PrefillScheduler,
    config: Py<PySchedulerConfig>,
}

#[pymethods]
impl PyPrefillScheduler {
    #[new]
    fn new(config: Bound<'_, PySchedulerConfig>) -> PyResult<Self> {
        Ok(PyPrefillScheduler {
            inner: PrefillScheduler::new(config.get().inner.clone())?,
            config: config.unbind(),
        })
    }

    fn add_request(&mut self, request: PyRef<'_, PyNewRequest>) -> PyResult<()> {
        Ok(self.inner.add_request(request.inner.clone())?)
    }

    fn abort_request(&mut self, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(self.inner.abort_request(request_id_arg(request_id)?))
    }

    fn has_unfinished_requests(&self) -> bool {
        self.inner.has_unfinished_requests()
    }

    #[pyo3(signature = (now=None))]
    fn schedule(&mut self, py: Python<'_>, now: Option<f64>) -> PyResult<PyStepPlan> {
        schedule_step(py, &mut self.inner, now, PrefillScheduler::schedule)
    }

    /// Ends every row of `plan` (`token_ids` must be empty).
    fn update(
        &mut self,
        py: Python<'_>,
        plan: PyRef<'_, PyStepPlan>,
        token_ids: &Bound<'_, PyAny>,
    ) -> PyResult<PyStepOutput> {
        update_step(
            py,
            &mut self.inner,
            &plan,
            token_ids,
            PrefillScheduler::update,
        )
    }

    fn check_invariants(&self) -> PyResult<()> {
        invariants(self.inner.check_invariants())
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, self.inner.stats())
    }

    /// The configuration this scheduler was built with.
    #[getter]
    fn config(&self, py: Python<'_>) -> Py<PySchedulerConfig> {
        self.config.clone_ref(py)
    }
}
