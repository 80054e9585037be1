//! `Sampler` and `SampleResult` for Python. The logits are read in place from a C-contiguous
//! float32 numpy array (no copy; anything else is rejected with a ValidationError naming the fix,
//! so the hot path never copies behind the caller's back); uint32 token arrays are read in place
//! too. The GIL is released while sampling.

use std::sync::Arc;

use numpy::{PyArray1, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::arrays::{arr, arr_shaped, float32_array, logits_view, Arr};
use super::errors::guard;
use super::params::PySamplingParams;
use super::tokens::{token_ids, TokenIds};
use crate::error::CoreError;
use crate::params::SamplingParams;
use crate::sampling::{
    filtered_probs, process_logits, sample, LogprobsMode, SampleRequest, Sampled, SamplerConfig,
};
use crate::types::TokenId;

fn invalid(param: impl Into<String>, code: &'static str, message: String) -> PyErr {
    CoreError::invalid(param, code, message).into()
}

fn token_lists<'py>(param: &str, obj: &Bound<'py, PyAny>) -> PyResult<Vec<TokenIds<'py>>> {
    let items = obj.try_iter().map_err(|_| {
        let msg = format!(
            "`{param}` must be a sequence of token sequences; got {}",
            obj.get_type()
        );
        invalid(param, "invalid_type", msg)
    })?;
    items
        .enumerate()
        .map(|(i, item)| token_ids(&format!("{param}[{i}]"), &item?))
        .collect()
}

fn indices<'py, T: pyo3::conversion::FromPyObjectOwned<'py>>(
    param: &str,
    rule: &str,
    obj: &Bound<'py, PyAny>,
) -> PyResult<Vec<T>> {
    obj.extract::<Vec<T>>().map_err(|_| {
        invalid(
            param,
            "invalid_type",
            format!("`{param}` must be a sequence of {rule}"),
        )
    })
}

fn check_len(param: &str, len: usize, num_samples: usize) -> PyResult<()> {
    if len == num_samples {
        return Ok(());
    }
    let msg = format!(
        "`{param}` must have one entry per sample ({num_samples}, the length of `rows`); got {len}"
    );
    Err(invalid(param, "length_mismatch", msg))
}

/// One step's draws as numpy columns: `token_ids[i]` and `logprobs[i]` (NaN where the sample
/// needs none: no `logprobs`, no best_of > n ranking), and `top_token_ids` / `top_logprobs` of
/// shape `[samples, max_k]`, padded with -1 / -inf.
#[pyclass(name = "SampleResult", module = "ferrollm._core", frozen, get_all)]
pub struct PySampleResult {
    token_ids: Arr<u32>,
    logprobs: Arr<f32>,
    top_token_ids: Py<PyAny>,
    top_logprobs: Py<PyAny>,
}

impl PySampleResult {
    fn new(py: Python<'_>, out: Vec<Sampled>) -> PyResult<Self> {
        let max_k = out.iter().map(|s| s.top_logprobs.len()).max().unwrap_or(0);
        let mut top_ids = vec![-1i32; out.len() * max_k];
        let mut top_lps = vec![f32::NEG_INFINITY; out.len() * max_k];
        for (i, s) in out.iter().enumerate() {
            for (j, &(id, lp)) in s.top_logprobs.iter().enumerate() {
                top_ids[i * max_k + j] = id as i32;
                top_lps[i * max_k + j] = lp;
            }
        }
        let shape = [out.len(), max_k];
        Ok(PySampleResult {
            token_ids: arr(py, out.iter().map(|s| s.token).collect()),
            logprobs: arr(
                py,
                out.iter().map(|s| s.logprob.unwrap_or(f32::NAN)).collect(),
            ),
            top_token_ids: arr_shaped(py, top_ids, shape)?,
            top_logprobs: arr_shaped(py, top_lps, shape)?,
        })
    }
}

#[pymethods]
impl PySampleResult {
    fn __len__(&self, py: Python<'_>) -> usize {
        self.token_ids.bind(py).len()
    }
}

/// `Sampler.sample`'s optional columns: the sample indices and the EOS ids.
type Extra<'py> = (Option<Bound<'py, PyAny>>, Option<Vec<TokenId>>);

#[pyclass(name = "Sampler", module = "ferrollm._core", frozen)]
pub struct PySampler {
    cfg: SamplerConfig,
}

#[pymethods]
impl PySampler {
    #[new]
    #[pyo3(signature = (logprobs_mode="raw"))]
    fn new(logprobs_mode: &str) -> PyResult<Self> {
        Ok(PySampler {
            cfg: SamplerConfig {
                logprobs_mode: LogprobsMode::parse(logprobs_mode)?,
            },
        })
    }

    #[getter]
    fn logprobs_mode(&self) -> &'static str {
        self.cfg.logprobs_mode.as_str()
    }

    /// Worker threads sampling runs on (rayon's global pool).
    #[getter]
    fn num_threads(&self) -> usize {
        rayon::current_num_threads()
    }

    /// `tokens` is `(prompts, outputs)`, one token list each per sample; `extra` is None or
    /// `(sample_indices or None, eos_token_ids or None)` (`ferrollm.testing.Sampler` spells
    /// them out as keywords).
    #[pyo3(signature = (logits, rows, params, tokens, seeds, extra=None))]
    fn sample(
        &self,
        logits: &Bound<'_, PyAny>,
        rows: &Bound<'_, PyAny>,
        params: Vec<PyRef<'_, PySamplingParams>>,
        tokens: (Bound<'_, PyAny>, Bound<'_, PyAny>),
        seeds: &Bound<'_, PyAny>,
        extra: Option<Extra<'_>>,
    ) -> PyResult<PySampleResult> {
        let py = logits.py();
        let (sample_indices, eos_token_ids) = extra.unwrap_or((None, None));
        let (array, vocab) = logits_view(logits)?;
        let rows: Vec<usize> = indices("rows", "row indices (non-negative ints)", rows)?;
        let n = rows.len();
        let params: Vec<Arc<SamplingParams>> = params.iter().map(|p| p.inner.clone()).collect();
        let prompts = token_lists("prompts", &tokens.0)?;
        let outputs = token_lists("outputs", &tokens.1)?;
        let seeds: Vec<u64> = indices("seeds", "seeds (ints in [0, 2^64))", seeds)?;
        let sample_indices: Vec<u32> = match &sample_indices {
            Some(obj) => indices("sample_indices", "ints in [0, 2^32)", obj)?,
            None => vec![0; n],
        };
        for (param, len) in [
            ("params", params.len()),
            ("prompts", prompts.len()),
            ("outputs", outputs.len()),
            ("seeds", seeds.len()),
            ("sample_indices", sample_indices.len()),
        ] {
            check_len(param, len, n)?;
        }
        let eos = eos_token_ids.unwrap_or_default();
        let reqs: Vec<SampleRequest<'_>> = (0..n)
            .map(|i| SampleRequest {
                row: rows[i],
                params: &params[i],
                prompt: prompts[i].as_slice(),
                output: outputs[i].as_slice(),
                seed: seeds[i],
                sample_index: sample_indices[i],
                eos_token_ids: &eos,
                allowed: None,
            })
            .collect();
        let flat = array
            .as_slice()
            .map_err(|e| invalid("logits", "not_contiguous", e.to_string()))?;
        let cfg = self.cfg;
        let out =
            py.detach(|| guard("Sampler.sample()", || sample(flat, vocab, &reqs, &cfg)))??;
        // A sample that could not be drawn fails the call (the scheduler fails its request).
        let out = out
            .into_iter()
            .collect::<Result<Vec<Sampled>, CoreError>>()?;
        PySampleResult::new(py, out)
    }

    /// Steps 1-8 (processors and temperature) on a copy of one row.
    #[staticmethod]
    #[pyo3(signature = (logits_row, params, prompt, output, eos_token_ids=None),
        text_signature = "(logits_row, params, prompt, output, eos_token_ids=())")]
    fn process_logits<'py>(
        py: Python<'py>,
        logits_row: &Bound<'py, PyAny>,
        params: PyRef<'py, PySamplingParams>,
        prompt: &Bound<'py, PyAny>,
        output: &Bound<'py, PyAny>,
        eos_token_ids: Option<Vec<TokenId>>,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        float32_array("logits_row", logits_row, 1)?;
        let mut row = logits_row
            .extract::<PyReadonlyArray1<'py, f32>>()?
            .as_array()
            .to_vec();
        let (prompt, output) = (token_ids("prompt", prompt)?, token_ids("output", output)?);
        let eos = eos_token_ids.unwrap_or_default();
        let req = SampleRequest {
            row: 0,
            params: &params.inner,
            prompt: prompt.as_slice(),
            output: output.as_slice(),
            seed: 0,
            sample_index: 0,
            eos_token_ids: &eos,
            allowed: None,
        };
        let vocab = row.len();
        guard("Sampler.process_logits()", || {
            process_logits(&mut row, &req, vocab)
        })??;
        Ok(arr(py, row).into_bound(py))
    }

    /// The distribution a draw uses over a processed row (steps 9-12), zeros for removed tokens.
    #[staticmethod]
    fn filtered_probs<'py>(
        py: Python<'py>,
        processed_row: &Bound<'py, PyAny>,
        params: PyRef<'py, PySamplingParams>,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        float32_array("processed_row", processed_row, 1)?;
        let row = processed_row
            .extract::<PyReadonlyArray1<'py, f32>>()?
            .as_array()
            .to_vec();
        let probs = guard("Sampler.filtered_probs()", || {
            filtered_probs(&row, &params.inner)
        })?;
        Ok(arr(py, probs).into_bound(py))
    }

    fn __repr__(&self) -> String {
        format!(
            "Sampler(logprobs_mode={:?})",
            self.cfg.logprobs_mode.as_str()
        )
    }
}
