//! `SchedulerConfig` for Python: a frozen, keyword-only configuration checked once on
//! construction (errors name the field), handed to `Scheduler(config, tokenizer=None)`.

use pyo3::prelude::*;

use super::tokens::extract_token_ids;
use crate::sampling::LogprobsMode;
use crate::sched::SchedulerConfig;
use crate::types::TokenId;

#[pyclass(name = "SchedulerConfig", module = "ferrollm._core", frozen, eq)]
#[derive(PartialEq)]
pub struct PySchedulerConfig {
    pub(crate) inner: SchedulerConfig,
}

#[pymethods]
impl PySchedulerConfig {
    #[new]
    #[pyo3(signature = (*, num_blocks, block_size=16, max_num_seqs=256, max_num_batched_tokens=8192,
        max_model_len=8192, max_num_waiting=4096, enable_prefix_caching=true, priority_aging_s=10.0,
        eos_token_ids=None, logprobs_mode="raw", vocab_size=0, seed=None, prefill_only=false),
        text_signature = "(*, num_blocks, block_size=16, max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=8192, max_num_waiting=4096, enable_prefix_caching=True, priority_aging_s=10.0, eos_token_ids=(), logprobs_mode='raw', vocab_size=0, seed=None, prefill_only=False)")]
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
        eos_token_ids: Option<&Bound<'_, PyAny>>,
        logprobs_mode: &str,
        vocab_size: usize,
        seed: Option<u64>,
        prefill_only: bool,
    ) -> PyResult<Self> {
        let eos_token_ids = match eos_token_ids {
            Some(ids) => extract_token_ids("eos_token_ids", ids)?,
            None => Vec::new(),
        };
        let inner = SchedulerConfig {
            num_blocks,
            block_size,
            max_num_seqs,
            max_num_batched_tokens,
            max_model_len,
            max_num_waiting,
            enable_prefix_caching,
            priority_aging_s,
            eos_token_ids,
            logprobs_mode: LogprobsMode::parse(logprobs_mode)?,
            vocab_size,
            seed,
            prefill_only,
        };
        inner.validate()?;
        Ok(PySchedulerConfig { inner })
    }

    #[getter]
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks
    }
    #[getter]
    fn block_size(&self) -> usize {
        self.inner.block_size
    }
    #[getter]
    fn max_num_seqs(&self) -> usize {
        self.inner.max_num_seqs
    }
    #[getter]
    fn max_num_batched_tokens(&self) -> usize {
        self.inner.max_num_batched_tokens
    }
    #[getter]
    fn max_model_len(&self) -> usize {
        self.inner.max_model_len
    }
    #[getter]
    fn max_num_waiting(&self) -> usize {
        self.inner.max_num_waiting
    }
    #[getter]
    fn enable_prefix_caching(&self) -> bool {
        self.inner.enable_prefix_caching
    }
    #[getter]
    fn priority_aging_s(&self) -> f64 {
        self.inner.priority_aging_s
    }
    #[getter]
    fn eos_token_ids(&self) -> Vec<TokenId> {
        self.inner.eos_token_ids.clone()
    }
    #[getter]
    fn logprobs_mode(&self) -> &'static str {
        self.inner.logprobs_mode.as_str()
    }
    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size
    }
    #[getter]
    fn seed(&self) -> Option<u64> {
        self.inner.seed
    }
    #[getter]
    fn prefill_only(&self) -> bool {
        self.inner.prefill_only
    }

    fn __repr__(&self) -> String {
        let c = &self.inner;
        let seed = c.seed.map_or_else(|| "None".to_string(), |s| s.to_string());
        let prefix = if c.enable_prefix_caching {
            "True"
        } else {
            "False"
        };
        format!(
            "SchedulerConfig(num_blocks={}, block_size={}, max_num_seqs={}, max_num_batched_tokens={}, max_model_len={}, max_num_waiting={}, enable_prefix_caching={prefix}, priority_aging_s={:?}, eos_token_ids={:?}, logprobs_mode={:?}, vocab_size={}, seed={seed}, prefill_only={})",
            c.num_blocks, c.block_size, c.max_num_seqs, c.max_num_batched_tokens, c.max_model_len,
            c.max_num_waiting, c.priority_aging_s, c.eos_token_ids, c.logprobs_mode.as_str(), c.vocab_size,
            if c.prefill_only { "True" } else { "False" }
        )
    }
}
