//! `StepPlan` and `StepOutput` for Python: flat numpy columns that own the Rust-built buffers
//! (moved, not copied); nothing per token becomes a Python object.

use numpy::PyUntypedArrayMethods;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

use super::arrays::{arr, arr2, arr_shaped, Arr};
use crate::sched::{StepOutput, StepPlan};

#[pyclass(name = "StepPlan", module = "ferrollm._core", frozen, get_all)]
pub struct PyStepPlan {
    pub(crate) step_id: u64,
    input_ids: Arr<i64>,
    positions: Arr<i64>,
    slot_mapping: Arr<i64>,
    cu_seqlens_q: Arr<i32>,
    context_lens: Arr<i32>,
    block_tables: Py<PyAny>,
    req_ids: Arr<u64>,
    seq_indices: Arr<u32>,
    lora_ids: Arr<u32>,
    num_draft_tokens: Arr<u32>,
    logits_indices: Arr<i64>,
    sample_rows: Arr<i32>,
    sample_seq_indices: Arr<u32>,
    block_copies: Py<PyAny>,
    num_rows: usize,
    num_samples: usize,
    num_scheduled_tokens: usize,
    num_prefill_tokens: usize,
    num_decode_tokens: usize,
    num_encoder_tokens: usize,
    preempted_req_ids: Arr<u64>,
    preempted_seq_indices: Arr<u32>,
    finished_req_ids: Arr<u64>,
    finished_reasons: Arr<u8>,
}

impl PyStepPlan {
    pub(crate) fn new(py: Python<'_>, p: StepPlan) -> PyResult<Self> {
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
            lora_ids: arr(py, p.lora_ids),
            num_draft_tokens: arr(py, p.num_draft_tokens),
            logits_indices: arr(py, p.logits_indices),
            sample_rows: arr(py, p.sample_rows),
            sample_seq_indices: arr(py, p.sample_seq_indices),
            num_rows,
            num_samples,
            num_scheduled_tokens: num_tokens,
            num_prefill_tokens: p.num_prefill_tokens,
            num_decode_tokens: p.num_decode_tokens,
            num_encoder_tokens: p.num_encoder_tokens,
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
    stop_token_ids: Arr<i64>,
    logprobs: Arr<f32>,
    sequence_scores: Arr<f32>,
    top_token_ids: Py<PyAny>,
    top_logprobs: Py<PyAny>,
    logprob_bytes: Py<PyBytes>,
    logprob_byte_offsets: Arr<u32>,
    finished_req_ids: Arr<u64>,
    failed_req_ids: Arr<u64>,
    failed_errors: Py<PyList>,
    held_req_ids: Arr<u64>,
}

impl PyStepOutput {
    pub(crate) fn new(py: Python<'_>, o: StepOutput) -> PyResult<Self> {
        let n = o.num_samples();
        Ok(PyStepOutput {
            top_token_ids: arr_shaped(py, o.top_token_ids, [n, o.num_top_logprobs])?,
            top_logprobs: arr_shaped(py, o.top_logprobs, [n, o.num_top_logprobs])?,
            text: PyString::new(py, &o.text).unbind(),
            logprob_bytes: PyBytes::new(py, &o.logprob_bytes).unbind(),
            logprob_byte_offsets: arr(py, o.logprob_byte_offsets),
            text_offsets: arr(py, o.text_offsets),
            stop_str_indices: arr(py, o.stop_str_indices),
            stop_token_ids: arr(py, o.stop_token_ids),
            logprobs: arr(py, o.logprobs),
            sequence_scores: arr(py, o.sequence_scores),
            req_ids: arr(py, o.req_ids),
            seq_indices: arr(py, o.seq_indices),
            token_ids: arr(py, o.token_ids),
            finish_reasons: arr(py, o.finish_reasons),
            finished_req_ids: arr(py, o.finished_req_ids),
            failed_req_ids: arr(py, o.failed_req_ids),
            failed_errors: PyList::new(
                py,
                o.failed_errors
                    .into_iter()
                    .map(|e| PyErr::from(e).into_value(py)),
            )?
            .unbind(),
            held_req_ids: arr(py, o.held_req_ids),
        })
    }
}

#[pymethods]
impl PyStepOutput {
    fn __len__(&self, py: Python<'_>) -> usize {
        self.token_ids.bind(py).len()
    }

    /// The text of each of `failed_errors`.
    #[getter]
    fn failed_messages(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let errors = self.failed_errors.bind(py);
        errors.iter().map(|e| Ok(e.str()?.to_string())).collect()
    }
}
