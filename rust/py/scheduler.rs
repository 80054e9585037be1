//! `Scheduler`, `StepPlan` and `StepOutput` for Python. Plans and outputs are numpy arrays that
//! own the Rust-built buffers (moved, not copied); nothing per token becomes a Python object.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use numpy::{Element, PyArray1, PyArrayMethods, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use super::detok::PyDetokenizer;
use super::errors::{guard, int_arg, SchedulerError};
use super::params::PySamplingParams;
use super::tokens::extract_token_ids;
use crate::error::CoreError;
use crate::params::{check_priority, SamplingParams};
use crate::sampling::{LogprobsMode, SamplerConfig};
use crate::sched::{Scheduler, SchedulerConfig, StepOutput, StepPlan};
use crate::types::{RequestId, TokenId};

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The sampler settings named by the constructor's `logprobs_mode`.
fn sampler_config(logprobs_mode: &str) -> Result<SamplerConfig, CoreError> {
    let logprobs_mode = match logprobs_mode {
        "raw" => LogprobsMode::Raw,
        "processed" => LogprobsMode::Processed,
        other => {
            return Err(CoreError::invalid(
                "logprobs_mode",
                "invalid_value",
                format!("`logprobs_mode` must be \"raw\" or \"processed\"; got {other:?}"),
            ))
        }
    };
    Ok(SamplerConfig { logprobs_mode })
}

fn request_id_arg(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    obj.extract::<u64>().map_err(|_| {
        let msg = format!("`request_id` must be an integer in [0, 2^64); got {obj}");
        CoreError::invalid("request_id", "out_of_range", msg).into()
    })
}

#[pyclass(name = "Scheduler", module = "ferrollm._core")]
pub struct PyScheduler {
    inner: Scheduler,
}

#[pymethods]
impl PyScheduler {
    #[new]
    #[pyo3(signature = (*, num_blocks, block_size=16, max_num_seqs=256, max_num_batched_tokens=8192,
        max_model_len=8192, max_num_waiting=4096, enable_prefix_caching=true, priority_aging_s=10.0,
        eos_token_ids=None, tokenizer=None, logprobs_mode="raw"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        num_blocks: usize,
        block_size: usize,
        max_num_seqs: usize,
        max_num_batched_tokens: usize,
        max_model_len: usize,
        max_num_waiting: usize,
        enable_prefix_caching: bool,
        priority_aging_s: f64,
        eos_token_ids: Option<Vec<TokenId>>,
        tokenizer: Option<PyRef<'_, PyDetokenizer>>,
        logprobs_mode: &str,
    ) -> PyResult<Self> {
        let cfg = SchedulerConfig {
            num_blocks,
            block_size,
            max_num_seqs,
            max_num_batched_tokens,
            max_model_len,
            max_num_waiting,
            enable_prefix_caching,
            priority_aging_s,
            eos_token_ids: eos_token_ids.unwrap_or_default(),
        };
        let mut inner = Scheduler::new(cfg)?;
        inner.set_detokenizer(tokenizer.map(|t| t.inner.clone()));
        inner.set_sampler_config(sampler_config(logprobs_mode)?);
        Ok(PyScheduler { inner })
    }

    #[pyo3(signature = (request_id, prompt_token_ids, params=None, *, priority=None, arrival_time=None,
        deadline=None, cache_salt=None),
        text_signature = "(self, request_id, prompt_token_ids, params=None, *, priority=None, arrival_time=None, deadline=None, cache_salt=None)")]
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
    ) -> PyResult<()> {
        let request_id = request_id_arg(request_id)?;
        let prompt = extract_token_ids("prompt_token_ids", prompt_token_ids)?;
        let params =
            params.map_or_else(|| Arc::new(SamplingParams::default()), |p| p.inner.clone());
        let priority = priority.map_or(Ok(i64::from(params.priority)), |p| {
            int_arg("priority", "an integer in [1, 5]", p)
        })?;
        let priority = check_priority(priority)?;
        let arrival = arrival_time.unwrap_or_else(now);
        let deadline = deadline.or(params.timeout_s.map(|t| arrival + t));
        let extra_key = cache_salt.map(|s| Arc::<str>::from(format!("salt:{s}")));
        self.inner.add_request(
            RequestId(request_id),
            prompt,
            params,
            priority,
            arrival,
            deadline,
            extra_key,
        )?;
        Ok(())
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

    /// `logits_or_token_ids`: the step's float32 logits `[num_samples, vocab]` (sampled here,
    /// read without copying when C-contiguous), or one sampled token id per sample.
    fn update(
        &mut self,
        py: Python<'_>,
        plan: PyRef<'_, PyStepPlan>,
        logits_or_token_ids: &Bound<'_, PyAny>,
    ) -> PyResult<PyStepOutput> {
        let (step_id, inner) = (plan.step_id, &mut self.inner);
        let out = if let Ok(logits) = logits_or_token_ids.extract::<PyReadonlyArray2<'_, f32>>() {
            let vocab = logits.shape()[1];
            let logits = logits.as_slice().map_err(|_| {
                CoreError::invalid(
                    "logits",
                    "not_contiguous",
                    "`logits` must be a C-contiguous float32 array (use np.ascontiguousarray)",
                )
            })?;
            py.detach(|| {
                guard("update()", || {
                    inner.update_with_logits(step_id, logits, vocab)
                })
            })??
        } else {
            let sampled = extract_token_ids("sampled_token_ids", logits_or_token_ids)?;
            py.detach(|| guard("update()", || inner.update(step_id, &sampled)))??
        };
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
                d.set_item("token_ids", PyArray1::from_vec(py, v.tokens))?;
                d.set_item("num_prompt_tokens", v.num_prompt_tokens)?;
                d.set_item("num_computed_tokens", v.num_computed_tokens)?;
                let table: Vec<u32> = v.block_table.iter().map(|b| b.0).collect();
                d.set_item("block_table", PyArray1::from_vec(py, table))?;
                Ok(d)
            })
            .collect()
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

type Arr<T> = Py<PyArray1<T>>;

fn arr<T: Element>(py: Python<'_>, v: Vec<T>) -> Arr<T> {
    PyArray1::from_vec(py, v).unbind()
}

fn arr2<T: Element>(py: Python<'_>, v: Vec<T>, cols: usize) -> PyResult<Py<PyAny>> {
    let rows = v.len().checked_div(cols).unwrap_or(0);
    arr_shaped(py, v, [rows, cols])
}

fn arr_shaped<T: Element>(py: Python<'_>, v: Vec<T>, shape: [usize; 2]) -> PyResult<Py<PyAny>> {
    Ok(PyArray1::from_vec(py, v)
        .reshape(shape)?
        .into_any()
        .unbind())
}

#[pyclass(name = "StepPlan", module = "ferrollm._core", frozen, get_all)]
pub struct PyStepPlan {
    step_id: u64,
    input_ids: Arr<i64>,
    positions: Arr<i64>,
    slot_mapping: Arr<i64>,
    cu_seqlens_q: Arr<i32>,
    context_lens: Arr<i32>,
    block_tables: Py<PyAny>,
    req_ids: Arr<u64>,
    seq_indices: Arr<u32>,
    logits_indices: Arr<i64>,
    sample_rows: Arr<i32>,
    sample_seq_indices: Arr<u32>,
    block_copies: Py<PyAny>,
    num_rows: usize,
    num_samples: usize,
    num_scheduled_tokens: usize,
    num_prefill_tokens: usize,
    num_decode_tokens: usize,
    preempted_req_ids: Arr<u64>,
    preempted_seq_indices: Arr<u32>,
    finished_req_ids: Arr<u64>,
    finished_reasons: Arr<u8>,
}

impl PyStepPlan {
    fn new(py: Python<'_>, p: StepPlan) -> PyResult<Self> {
        let (num_rows, num_samples, num_tokens) =
            (p.num_rows(), p.num_samples(), p.num_scheduled_tokens());
        Ok(PyStepPlan {
            step_id: p.step_id,
            block_tables: arr2(py, p.block_tables, p.max_num_blocks)?,
            block_copies: arr2(py, p.block_copies, 2)?,
            input_ids: arr(py, p.input_ids),
            positions: arr(py, p.positions),
            slot_mapping: arr(py, p.slot_mapping),
            cu_seqlens_q: arr(py, p.cu_seqlens_q),
            context_lens: arr(py, p.context_lens),
            req_ids: arr(py, p.req_ids),
            seq_indices: arr(py, p.seq_indices),
            logits_indices: arr(py, p.logits_indices),
            sample_rows: arr(py, p.sample_rows),
            sample_seq_indices: arr(py, p.sample_seq_indices),
            num_rows,
            num_samples,
            num_scheduled_tokens: num_tokens,
            num_prefill_tokens: p.num_prefill_tokens,
            num_decode_tokens: p.num_decode_tokens,
            preempted_req_ids: arr(py, p.preempted_req_ids),
            preempted_seq_indices: arr(py, p.preempted_seq_indices),
            finished_req_ids: arr(py, p.finished_req_ids),
            finished_reasons: arr(py, p.finished_reasons),
        })
    }
}

#[pymethods]
impl PyStepPlan {
    fn __len__(&self) -> usize {
        self.num_rows
    }

    fn __repr__(&self) -> String {
        format!(
            "StepPlan(step_id={}, num_rows={}, num_scheduled_tokens={}, num_samples={})",
            self.step_id, self.num_rows, self.num_scheduled_tokens, self.num_samples
        )
    }
}

#[pyclass(name = "StepOutput", module = "ferrollm._core", frozen, get_all)]
pub struct PyStepOutput {
    req_ids: Arr<u64>,
    seq_indices: Arr<u32>,
    token_ids: Arr<u32>,
    finish_reasons: Arr<u8>,
    text: Py<PyString>,
    text_offsets: Arr<u32>,
    stop_str_indices: Arr<i32>,
    logprobs: Arr<f32>,
    top_token_ids: Py<PyAny>,
    top_logprobs: Py<PyAny>,
    finished_req_ids: Arr<u64>,
}

impl PyStepOutput {
    fn new(py: Python<'_>, o: StepOutput) -> PyResult<Self> {
        let n = o.num_samples();
        Ok(PyStepOutput {
            top_token_ids: arr_shaped(py, o.top_token_ids, [n, o.num_top_logprobs])?,
            top_logprobs: arr_shaped(py, o.top_logprobs, [n, o.num_top_logprobs])?,
            text: PyString::new(py, &o.text).unbind(),
            text_offsets: arr(py, o.text_offsets),
            stop_str_indices: arr(py, o.stop_str_indices),
            logprobs: arr(py, o.logprobs),
            req_ids: arr(py, o.req_ids),
            seq_indices: arr(py, o.seq_indices),
            token_ids: arr(py, o.token_ids),
            finish_reasons: arr(py, o.finish_reasons),
            finished_req_ids: arr(py, o.finished_req_ids),
        })
    }
}

#[pymethods]
impl PyStepOutput {
    fn __len__(&self, py: Python<'_>) -> usize {
        self.token_ids.bind(py).len()
    }
}
