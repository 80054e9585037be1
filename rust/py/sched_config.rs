//! `SchedulerConfig` for Python: a frozen, keyword-only configuration checked once on
//! construction (errors name the field), handed to `Scheduler(config, tokenizer=None)`.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::args::Args;
use super::tokens::extract_token_ids;
use crate::error::CoreError;
use crate::sampling::LogprobsMode;
use crate::sched::{NgramConfig, SchedulerConfig};
use crate::types::TokenId;

/// The keywords `SchedulerConfig(...)` takes.
const NAMES: &[&str] = &[
    "num_blocks",
    "block_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "max_num_waiting",
    "enable_prefix_caching",
    "priority_aging_s",
    "eos_token_ids",
    "logprobs_mode",
    "vocab_size",
    "seed",
    "speculative",
    "num_speculative_tokens",
    "ngram_min",
    "ngram_max",
    "max_loras",
    "max_num_encoder_tokens",
];

#[pyclass(name = "SchedulerConfig", module = "ferrollm._core", frozen, eq)]
#[derive(PartialEq)]
pub struct PySchedulerConfig {
    pub(crate) inner: SchedulerConfig,
}

impl PySchedulerConfig {
    /// The n-gram settings in force (the defaults when speculation is off).
    fn ngram(&self) -> NgramConfig {
        self.inner.speculative.unwrap_or_default()
    }
}

#[pymethods]
impl PySchedulerConfig {
    #[new]
    #[pyo3(signature = (**kwargs),
        text_signature = "(*, num_blocks, block_size=16, max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=8192, max_num_waiting=4096, enable_prefix_caching=True, priority_aging_s=10.0, eos_token_ids=(), logprobs_mode='raw', vocab_size=0, seed=None, speculative=None, num_speculative_tokens=4, ngram_min=1, ngram_max=3, max_loras=0, max_num_encoder_tokens=None)")]
    fn new(py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let a = Args::bind("SchedulerConfig()", NAMES, 0, &PyTuple::empty(py), kwargs)?;
        let d = SchedulerConfig::default();
        let n = NgramConfig::default();
        let ngram = NgramConfig {
            min_n: a.extract("ngram_min")?.unwrap_or(n.min_n),
            max_n: a.extract("ngram_max")?.unwrap_or(n.max_n),
            num_draft_tokens: a
                .extract("num_speculative_tokens")?
                .unwrap_or(n.num_draft_tokens),
        };
        let speculative = match a.extract::<String>("speculative")?.as_deref() {
            None => None,
            Some("ngram") => Some(ngram),
            Some(other) => {
                let msg = format!("`speculative` must be \"ngram\" or None; got {other:?}");
                return Err(CoreError::invalid("speculative", "invalid_choice", msg).into());
            }
        };
        let eos_token_ids = match a.get("eos_token_ids") {
            Some(ids) => extract_token_ids("eos_token_ids", ids)?,
            None => Vec::new(),
        };
        let logprobs_mode = a.extract::<String>("logprobs_mode")?;
        let max_num_batched_tokens = a
            .extract("max_num_batched_tokens")?
            .unwrap_or(d.max_num_batched_tokens);
        let inner = SchedulerConfig {
            num_blocks: a.required("num_blocks")?,
            block_size: a.extract("block_size")?.unwrap_or(d.block_size),
            max_num_seqs: a.extract("max_num_seqs")?.unwrap_or(d.max_num_seqs),
            max_num_batched_tokens,
            max_model_len: a.extract("max_model_len")?.unwrap_or(d.max_model_len),
            max_num_waiting: a.extract("max_num_waiting")?.unwrap_or(d.max_num_waiting),
            enable_prefix_caching: a
                .extract("enable_prefix_caching")?
                .unwrap_or(d.enable_prefix_caching),
            priority_aging_s: a.extract("priority_aging_s")?.unwrap_or(d.priority_aging_s),
            eos_token_ids,
            logprobs_mode: LogprobsMode::parse(logprobs_mode.as_deref().unwrap_or("raw"))?,
            vocab_size: a.extract("vocab_size")?.unwrap_or(d.vocab_size),
            seed: a.extract("seed")?,
            speculative,
            max_loras: a.extract("max_loras")?.unwrap_or(d.max_loras),
            max_num_encoder_tokens: a.extract("max_num_encoder_tokens")?.unwrap_or_else(|| {
                SchedulerConfig::default_max_num_encoder_tokens(max_num_batched_tokens)
            }),
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
    /// "ngram" when prompt-lookup speculative decoding is on, else None.
    #[getter]
    fn speculative(&self) -> Option<&'static str> {
        self.inner.speculative.map(|_| "ngram")
    }
    #[getter]
    fn num_speculative_tokens(&self) -> usize {
        self.ngram().num_draft_tokens
    }
    #[getter]
    fn ngram_min(&self) -> usize {
        self.ngram().min_n
    }
    #[getter]
    fn ngram_max(&self) -> usize {
        self.ngram().max_n
    }
    /// Distinct LoRA adapters running at once (0: no limit).
    #[getter]
    fn max_loras(&self) -> usize {
        self.inner.max_loras
    }
    /// Encoder tokens (media span positions) whose encoding a step may start, at most.
    #[getter]
    fn max_num_encoder_tokens(&self) -> usize {
        self.inner.max_num_encoder_tokens
    }

    fn __repr__(&self) -> String {
        let c = &self.inner;
        let seed = c.seed.map_or_else(|| "None".to_string(), |s| s.to_string());
        let spec = if c.speculative.is_some() {
            "'ngram'"
        } else {
            "None"
        };
        let ngram = self.ngram();
        let prefix = if c.enable_prefix_caching {
            "True"
        } else {
            "False"
        };
        format!(
            "SchedulerConfig(num_blocks={}, block_size={}, max_num_seqs={}, max_num_batched_tokens={}, max_model_len={}, max_num_waiting={}, enable_prefix_caching={prefix}, priority_aging_s={:?}, eos_token_ids={:?}, logprobs_mode={:?}, vocab_size={}, seed={seed}, speculative={spec}, num_speculative_tokens={}, ngram_min={}, ngram_max={}, max_loras={}, max_num_encoder_tokens={})",
            c.num_blocks, c.block_size, c.max_num_seqs, c.max_num_batched_tokens, c.max_model_len,
            c.max_num_waiting, c.priority_aging_s, c.eos_token_ids, c.logprobs_mode.as_str(), c.vocab_size,
            ngram.num_draft_tokens, ngram.min_n, ngram.max_n, c.max_loras, c.max_num_encoder_tokens
        )
    }
}
