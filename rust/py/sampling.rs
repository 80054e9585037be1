//! `Sampler` and `SampleResult` for Python. The logits are read in place from a C-contiguous
//! float32 numpy array (no copy; anything else is rejected with a ValidationError naming the fix,
//! so the hot path never copies behind the caller's back); uint32 token arrays are read in place
//! too. The GIL is released while sampling.

use std::collections::HashMap;
use std::sync::Arc;

use numpy::{
    PyArray1, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2,
    PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;

use super::errors::guard;
use super::params::PySamplingParams;
use crate::error::CoreError;
use crate::params::SamplingParams;
use crate::sampling::{
    filtered_probs, process_logits, sample, LogprobsMode, SampleRequest, Sampled, SamplerConfig,
};
use crate::types::TokenId;

fn invalid(param: impl Into<String>, code: &'static str, message: String) -> PyErr {
    CoreError::invalid(param, code, message).into()
}

/// The array's dtype and layout checked, so that only float32 reaches the extraction.
fn float32_array<'py>(param: &str, obj: &Bound<'py, PyAny>, ndim: usize) -> PyResult<()> {
    let Ok(array) = obj.cast::<PyUntypedArray>() else {
        let msg = format!(
            "`{param}` must be a {ndim}-D float32 numpy array; got {}",
            obj.get_type()
        );
        return Err(invalid(param, "invalid_type", msg));
    };
    if array.ndim() != ndim {
        let msg = format!(
            "`{param}` must be {ndim}-D; got {} dimensions",
            array.ndim()
        );
        return Err(invalid(param, "bad_shape", msg));
    }
    if !array.dtype().is_equiv_to(&numpy::dtype::<f32>(obj.py())) {
        let msg = format!(
            "`{param}` must be float32; got {} (convert with `.astype(np.float32)`)",
            array.dtype()
        );
        return Err(invalid(param, "invalid_dtype", msg));
    }
    Ok(())
}

/// The `[rows, vocab]` logits as a borrowed C-contiguous float32 array.
fn logits_view<'py>(obj: &Bound<'py, PyAny>) -> PyResult<(PyReadonlyArray2<'py, f32>, usize)> {
    float32_array("logits", obj, 2)?;
    let array: PyReadonlyArray2<'py, f32> = obj.extract()?;
    if !array.is_c_contiguous() {
        let msg = "`logits` must be C-contiguous (rows of `vocab` adjacent values); \
                   use `np.ascontiguousarray(logits)`"
            .to_string();
        return Err(invalid("logits", "not_contiguous", msg));
    }
    let vocab = array.shape()[1];
    Ok((array, vocab))
}

/// A token sequence: a uint32 numpy array read in place, or converted ids.
enum Tokens<'py> {
    View(PyReadonlyArray1<'py, u32>),
    Owned(Vec<TokenId>),
}

impl Tokens<'_> {
    fn as_slice(&self) -> &[TokenId] {
        match self {
            // Only contiguous views are kept (see `tokens`), so `as_slice` succeeds.
            Tokens::View(a) => a.as_slice().unwrap_or(&[]),
            Tokens::Owned(v) => v,
        }
    }
}

/// Token ids from a 1-D integer numpy array or a sequence of ints, each in [0, 2^32).
fn tokens<'py>(param: &str, obj: &Bound<'py, PyAny>) -> PyResult<Tokens<'py>> {
    if let Ok(array) = obj.extract::<PyReadonlyArray1<'py, u32>>() {
        if array.as_slice().is_ok() {
            return Ok(Tokens::View(array));
        }
        return Ok(Tokens::Owned(array.as_array().to_vec()));
    }
    let rule = format!("`{param}` must be a 1-D sequence of token ids in [0, 2^32)");
    let values: Vec<i64> = obj.extract().map_err(|_| {
        invalid(
            param,
            "invalid_token_ids",
            format!("{rule}; got {}", obj.get_type()),
        )
    })?;
    values
        .iter()
        .map(|&v| TokenId::try_from(v))
        .collect::<Result<Vec<_>, _>>()
        .map(Tokens::Owned)
        .map_err(|_| {
            invalid(
                param,
                "invalid_token_ids",
                format!("{rule}; got a value outside it"),
            )
        })
}

fn token_lists<'py>(param: &str, obj: &Bound<'py, PyAny>) -> PyResult<Vec<Tokens<'py>>> {
    let items = obj.try_iter().map_err(|_| {
        let msg = format!(
            "`{param}` must be a sequence of token sequences; got {}",
            obj.get_type()
        );
        invalid(param, "invalid_type", msg)
    })?;
    items
        .enumerate()
        .map(|(i, item)| tokens(&format!("{param}[{i}]"), &item?))
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

type Arr<T> = Py<PyArray1<T>>;

/// One step's draws as numpy columns: `token_ids[i]` and `logprobs[i]` (NaN where logprobs were
/// not asked for), and `top_token_ids` / `top_logprobs` of shape `[samples, max_k]`, padded with
/// -1 / -inf.
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
            token_ids: PyArray1::from_vec(py, out.iter().map(|s| s.token).collect()).unbind(),
            logprobs: PyArray1::from_vec(
                py,
                out.iter().map(|s| s.logprob.unwrap_or(f32::NAN)).collect(),
            )
            .unbind(),
            top_token_ids: PyArray1::from_vec(py, top_ids)
                .reshape(shape)?
                .into_any()
                .unbind(),
            top_logprobs: PyArray1::from_vec(py, top_lps)
                .reshape(shape)?
                .into_any()
                .unbind(),
        })
    }
}

#[pymethods]
impl PySampleResult {
    fn __len__(&self, py: Python<'_>) -> usize {
        self.token_ids.bind(py).len()
    }
}

#[pyclass(name = "Sampler", module = "ferrollm._core", frozen)]
pub struct PySampler {
    cfg: SamplerConfig,
}

fn mode_name(mode: LogprobsMode) -> &'static str {
    match mode {
        LogprobsMode::Raw => "raw",
        LogprobsMode::Processed => "processed",
    }
}

#[pymethods]
impl PySampler {
    #[new]
    #[pyo3(signature = (logprobs_mode="raw"))]
    fn new(logprobs_mode: &str) -> PyResult<Self> {
        let logprobs_mode = match logprobs_mode {
            "raw" => LogprobsMode::Raw,
            "processed" => LogprobsMode::Processed,
            other => {
                let msg = format!("`logprobs_mode` must be 'raw' or 'processed'; got {other:?}");
                return Err(invalid("logprobs_mode", "invalid_choice", msg));
            }
        };
        Ok(PySampler {
            cfg: SamplerConfig { logprobs_mode },
        })
    }

    #[getter]
    fn logprobs_mode(&self) -> &'static str {
        mode_name(self.cfg.logprobs_mode)
    }

    /// Worker threads sampling runs on (rayon's global pool).
    #[getter]
    fn num_threads(&self) -> usize {
        rayon::current_num_threads()
    }

    #[pyo3(signature = (logits, rows, params, prompts, outputs, seeds, sample_indices=None, eos_token_ids=None),
        text_signature = "(self, logits, rows, params, prompts, outputs, seeds, sample_indices=None, eos_token_ids=())")]
    #[allow(clippy::too_many_arguments)]
    fn sample(
        &self,
        py: Python<'_>,
        logits: &Bound<'_, PyAny>,
        rows: &Bound<'_, PyAny>,
        params: Vec<PyRef<'_, PySamplingParams>>,
        prompts: &Bound<'_, PyAny>,
        outputs: &Bound<'_, PyAny>,
        seeds: &Bound<'_, PyAny>,
        sample_indices: Option<&Bound<'_, PyAny>>,
        eos_token_ids: Option<Vec<TokenId>>,
    ) -> PyResult<PySampleResult> {
        let (array, vocab) = logits_view(logits)?;
        let rows: Vec<usize> = indices("rows", "row indices (non-negative ints)", rows)?;
        let n = rows.len();
        let params: Vec<Arc<SamplingParams>> = params.iter().map(|p| p.inner.clone()).collect();
        let prompts = token_lists("prompts", prompts)?;
        let outputs = token_lists("outputs", outputs)?;
        let seeds: Vec<u64> = indices("seeds", "seeds (ints in [0, 2^64))", seeds)?;
        let sample_indices: Vec<u32> = match sample_indices {
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
            })
            .collect();
        let flat = array
            .as_slice()
            .map_err(|e| invalid("logits", "not_contiguous", e.to_string()))?;
        let cfg = self.cfg;
        let out =
            py.detach(|| guard("Sampler.sample()", || sample(flat, vocab, &reqs, &cfg)))??;
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
        let (prompt, output) = (tokens("prompt", prompt)?, tokens("output", output)?);
        let eos = eos_token_ids.unwrap_or_default();
        let req = SampleRequest {
            row: 0,
            params: &params.inner,
            prompt: prompt.as_slice(),
            output: output.as_slice(),
            seed: 0,
            sample_index: 0,
            eos_token_ids: &eos,
        };
        let vocab = row.len();
        guard("Sampler.process_logits()", || {
            process_logits(&mut row, &req, vocab)
        })??;
        Ok(PyArray1::from_vec(py, row))
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
        Ok(PyArray1::from_vec(py, probs))
    }

    /// Test-only: `SamplingParams` with the sampling fields set directly, without validation.
    #[staticmethod]
    #[pyo3(signature = (*, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0,
        repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None,
        embedding_bias=None, allowed_token_ids=None, bad_words=None, min_tokens=0,
        no_repeat_ngram_size=0, seed=None, logprobs=None, stop_token_ids=None))]
    #[allow(clippy::too_many_arguments)]
    fn _params_for_tests(
        temperature: f32,
        top_k: u32,
        top_p: f32,
        min_p: f32,
        typical_p: f32,
        repetition_penalty: f32,
        presence_penalty: f32,
        frequency_penalty: f32,
        logit_bias: Option<HashMap<TokenId, f32>>,
        embedding_bias: Option<Vec<f32>>,
        allowed_token_ids: Option<Vec<TokenId>>,
        bad_words: Option<Vec<Vec<TokenId>>>,
        min_tokens: u32,
        no_repeat_ngram_size: u32,
        seed: Option<u64>,
        logprobs: Option<u32>,
        stop_token_ids: Option<Vec<TokenId>>,
    ) -> PySamplingParams {
        // Normalised as `validate` would leave them: bias sorted by id, allowed ids sorted, unique.
        let mut logit_bias: Vec<(TokenId, f32)> =
            logit_bias.unwrap_or_default().into_iter().collect();
        logit_bias.sort_by_key(|&(id, _)| id);
        let allowed_token_ids = allowed_token_ids.map(|mut ids| {
            ids.sort_unstable();
            ids.dedup();
            ids
        });
        let inner = SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            typical_p,
            repetition_penalty,
            presence_penalty,
            frequency_penalty,
            logit_bias,
            embedding_bias: embedding_bias.map(Arc::from),
            allowed_token_ids,
            bad_words: bad_words.unwrap_or_default(),
            min_tokens,
            no_repeat_ngram_size,
            seed,
            logprobs,
            stop_token_ids: stop_token_ids.unwrap_or_default(),
            ..SamplingParams::default()
        };
        PySamplingParams {
            inner: Arc::new(inner),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Sampler(logprobs_mode={:?})",
            mode_name(self.cfg.logprobs_mode)
        )
    }
}
