//! `Scheduler` for Python: a thin wrapper that extracts arguments, releases the GIL for work
//! that scales with the batch, and converts results (`StepPlan` / `StepOutput` in step.rs).
//! Defaults and checks of a new request live in the core (`sched::NewRequest`).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::arrays::{arr, float32_array, logits_view};
use super::detok::PyDetokenizer;
use super::errors::{guard, int_arg, SchedulerError};
use super::grammar::PyCompiledGrammar;
use super::params::PySamplingParams;
use super::sched_config::PySchedulerConfig;
use super::step::{PyStepOutput, PyStepPlan};
use super::tokens::{extract_token_ids, token_ids};
use crate::error::CoreError;
use crate::params::SamplingParams;
use crate::sched::{NewRequest, Scheduler};
use crate::types::RequestId;
use numpy::PyReadonlyArray2;

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn request_id_arg(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    obj.extract::<u64>().map_err(|_| {
        let msg = format!("`request_id` must be an integer in [0, 2^64); got {obj}");
        CoreError::invalid("request_id", "out_of_range", msg).into()
    })
}

/// `draft_logits` as a flat copy of its `[num_draft_tokens, vocab]` float32 values.
fn draft_logits_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<f32>> {
    float32_array("draft_logits", obj, 2)?;
    let array: PyReadonlyArray2<'_, f32> = obj.extract()?;
    Ok(array.as_array().iter().copied().collect())
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

    #[pyo3(signature = (request_id, prompt_token_ids, params=None, *, priority=None, arrival_time=None,
        deadline=None, cache_salt=None, grammar=None, draft_tokens=None, draft_logits=None,
        num_virtual_tokens=0),
        text_signature = "(self, request_id, prompt_token_ids, params=None, *, priority=None, arrival_time=None, deadline=None, cache_salt=None, grammar=None, draft_tokens=None, draft_logits=None, num_virtual_tokens=0)")]
    #[allow(clippy::too_many_arguments)]
    fn add_request(
        &mut self,
        request_id: &Bound<'_, PyAny>,
        prompt_token_ids: &Bound<'_, PyAny>,
        params: Option<PyRef<'_, PySamplingParams>>,
        priority: Option<&Bound<'_, PyAny>>,
        arrival_time: Option<f64>,
        deadline: Option<f64>,
        cache_salt: Option<String>,
        grammar: Option<PyRef<'_, PyCompiledGrammar>>,
        draft_tokens: Option<&Bound<'_, PyAny>>,
        draft_logits: Option<&Bound<'_, PyAny>>,
        num_virtual_tokens: u32,
    ) -> PyResult<()> {
        let draft_tokens = match draft_tokens {
            Some(ids) => extract_token_ids("draft_tokens", ids)?,
            None => Vec::new(),
        };
        let draft_logits = draft_logits.map(draft_logits_arg).transpose()?;
        let req = NewRequest {
            id: RequestId(request_id_arg(request_id)?),
            prompt_token_ids: extract_token_ids("prompt_token_ids", prompt_token_ids)?,
            num_virtual_tokens,
            params: params.map_or_else(|| Arc::new(SamplingParams::default()), |p| p.inner.clone()),
            priority: priority
                .map(|p| int_arg("priority", "an integer in [1, 5]", p))
                .transpose()?,
            arrival_time: arrival_time.unwrap_or_else(now),
            deadline,
            cache_salt,
            grammar: grammar.map(|g| g.inner.clone()),
            draft_tokens,
            draft_logits,
        };
        Ok(self.inner.add_request(req)?)
    }

    fn abort_request(&mut self, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(self
            .inner
            .abort_request(RequestId(request_id_arg(request_id)?)))
    }

    fn has_unfinished_requests(&self) -> bool {
        self.inner.has_unfinished_requests()
    }

    #[pyo3(signature = (now=None))]
    fn schedule(&mut self, py: Python<'_>, now: Option<f64>) -> PyResult<PyStepPlan> {
        let t = now.unwrap_or_else(self::now);
        let inner = &mut self.inner;
        let plan = py.detach(|| guard("schedule()", || inner.schedule(t)))?;
        PyStepPlan::new(py, plan)
    }

    /// Applies one sampled token id per sample of `plan`.
    fn update(
        &mut self,
        py: Python<'_>,
        plan: PyRef<'_, PyStepPlan>,
        token_ids: &Bound<'_, PyAny>,
    ) -> PyResult<PyStepOutput> {
        let (step_id, inner) = (plan.step_id, &mut self.inner);
        let sampled = self::token_ids("token_ids", token_ids)?;
        let sampled = sampled.as_slice();
        let out = py.detach(|| guard("update()", || inner.update(step_id, sampled)))??;
        PyStepOutput::new(py, out)
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
        self.inner
            .check_invariants()
            .map_err(|e| SchedulerError::new_err(format!("invariant broken: {e}")))
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
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
