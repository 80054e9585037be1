//! The per-request parameters: one validated, immutable struct shared (behind an `Arc`) by the
//! scheduler, the sampler, the detokenizer and the stop matcher. `validate` builds it from each
//! API route's raw fields.

use crate::error::{CoreError, CoreResult};
use std::sync::Arc;

use crate::types::TokenId;

/// Largest `n` (parallel sequences per request) the scheduler accepts.
pub const MAX_N: u32 = 128;

/// How many top alternatives a request may ask for per token (OpenAI `top_logprobs` <= 20).
pub const MAX_LOGPROBS: u32 = 20;

/// Validated, immutable parameters of one request: what the scheduler, the sampler, the
/// detokenizer and the stop matcher act on. Built by `validate` (per API route) or by
/// [`SamplingParams::new`] plus struct update from [`Default`]; every field is already
/// normalised (for example `top_k == 0` means "off" whatever the route called it).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    // --- scheduler ---------------------------------------------------------------------------
    /// Number of output sequences returned (>= 1).
    pub n: u32,
    /// Number of candidate sequences generated (>= n); the best `n` by cumulative logprob are
    /// returned. With `use_beam_search` it is the beam width.
    pub best_of: u32,
    /// Beam search instead of sampling: `best_of` beams, the best `n` hypotheses returned.
    pub use_beam_search: bool,
    /// Beam search: a finished hypothesis scores `sum_logprobs / generated_len^length_penalty`
    /// (HF transformers; > 0 favours longer hypotheses, < 0 shorter ones).
    pub length_penalty: f32,
    /// Beam search: when the search ends (HF `early_stopping`).
    pub early_stopping: EarlyStopping,
    /// Cap on generated tokens per sequence; `None` = until `max_model_len`.
    pub max_tokens: Option<u32>,
    /// EOS, stop token ids and stop strings do not end a sequence before this many tokens.
    pub min_tokens: u32,
    /// When true, EOS does not end the sequence (stop token ids still do).
    pub ignore_eos: bool,
    /// Token ids that end the sequence (the token is kept in `token_ids`; its text is dropped
    /// unless `include_stop_str_in_output`).
    pub stop_token_ids: Vec<TokenId>,
    /// Scheduling priority, 1 (highest) to 5 (lowest, the default).
    pub priority: u8,
    /// Wall-clock budget in seconds from arrival (queueing + generation); `None` = no limit.
    pub timeout_s: Option<f64>,

    // --- stops on text and token sequences --------------------------------------------------
    /// Stop strings, matched on the decoded text (each non-empty).
    pub stop: Vec<String>,
    /// Multi-token stop sequences (TensorRT-LLM `stop_words_list`), matched on token ids.
    pub stop_token_sequences: Vec<Vec<TokenId>>,
    /// Keep the matched stop string (or stop token's text) in the output text.
    pub include_stop_str_in_output: bool,

    // --- detokenization ----------------------------------------------------------------------
    /// Leave special tokens (BOS, EOS, padding, ...) out of the text.
    pub skip_special_tokens: bool,
    /// With `skip_special_tokens == false`: put a space between a special token and its
    /// neighbours.
    pub spaces_between_special_tokens: bool,

    // --- sampling (applied in this order; see `sampling`) -------------------------------------
    /// Sparse additive bias per token id, sorted by id, ids unique (OpenAI `logit_bias`).
    pub logit_bias: Vec<(TokenId, f32)>,
    /// Dense additive bias over the whole vocabulary (TensorRT-LLM `embedding_bias`).
    pub embedding_bias: Option<Arc<[f32]>>,
    /// When set, only these token ids may be sampled (sorted, unique, non-empty).
    pub allowed_token_ids: Option<Vec<TokenId>>,
    /// Token sequences that must not be generated: the last token of a sequence is banned
    /// when the rest of it matches the tail of the output.
    pub bad_words: Vec<Vec<TokenId>>,
    /// No n-gram of this size may appear twice in the output (0 = off).
    pub no_repeat_ngram_size: u32,
    /// Multiplicative penalty over prompt + output tokens (1 = off).
    pub repetition_penalty: f32,
    /// OpenAI presence penalty over output tokens (0 = off).
    pub presence_penalty: f32,
    /// OpenAI frequency penalty over output tokens (0 = off).
    pub frequency_penalty: f32,
    /// Softmax temperature; 0 = greedy (argmax after the processors above).
    pub temperature: f32,
    /// Keep the k most probable tokens; 0 = off.
    pub top_k: u32,
    /// Nucleus sampling threshold in (0, 1]; 1 = off.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the top probability; 0 = off.
    pub min_p: f32,
    /// Locally typical sampling mass in (0, 1]; 1 = off.
    pub typical_p: f32,
    /// Seed of the counter-based random stream; `None` = a random seed per request.
    pub seed: Option<u64>,
    /// Return the chosen token's logprob and this many top alternatives (0..=20); `None` = no
    /// logprobs.
    pub logprobs: Option<u32>,
    /// Score the prompt: each prompt token's raw logprob (log-softmax of the model's logits,
    /// no processors), its rank and this many top alternatives (0..=20), computed during
    /// prefill; `None` = none. A request with it skips the prefix cache, whose hits would skip
    /// the prompt positions it must score.
    pub prompt_logprobs: Option<u32>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            n: 1,
            best_of: 1,
            use_beam_search: false,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::Heuristic,
            max_tokens: None,
            min_tokens: 0,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            priority: 5,
            timeout_s: None,
            stop: Vec::new(),
            stop_token_sequences: Vec::new(),
            include_stop_str_in_output: false,
            skip_special_tokens: true,
            spaces_between_special_tokens: true,
            logit_bias: Vec::new(),
            embedding_bias: None,
            allowed_token_ids: None,
            bad_words: Vec::new(),
            no_repeat_ngram_size: 0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            typical_p: 1.0,
            seed: None,
            logprobs: None,
            prompt_logprobs: None,
        }
    }
}

/// When a beam search ends, as HF transformers' `early_stopping` (`False`, `True`, `"never"`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EarlyStopping {
    /// `False`: once `best_of` hypotheses are finished and the best running beam, at its current
    /// length, can no longer beat the worst of them.
    #[default]
    Heuristic,
    /// `True`: as soon as `best_of` hypotheses are finished.
    Finished,
    /// `"never"`: only when no running beam could beat the worst finished hypothesis even at
    /// the longest length it may reach (the canonical beam search).
    Never,
}

impl EarlyStopping {
    /// Python's spelling: `False`, `True` or `"never"`.
    pub fn as_py(self) -> &'static str {
        match self {
            EarlyStopping::Heuristic => "False",
            EarlyStopping::Finished => "True",
            EarlyStopping::Never => "'never'",
        }
    }
}

impl SamplingParams {
    /// True when the draw is deterministic: temperature 0 or top-k 1 (argmax after the
    /// logits processors).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// Sequences the scheduler runs for the request (its seats): `best_of`, which is never
    /// below `n` (the `n` best of them are returned).
    pub fn num_candidates(&self) -> u32 {
        self.best_of.max(self.n)
    }

    /// True when sampling more candidates than it returns (`best_of` > `n`, no beam search):
    /// the scheduler then ranks them by cumulative logprob once all have finished.
    pub fn ranks_candidates(&self) -> bool {
        !self.use_beam_search && self.best_of > self.n
    }

    /// Whether each drawn token's logprob must be computed: asked for (`logprobs`), or needed
    /// to rank candidates (then it is computed even though no entry is returned).
    pub fn needs_token_logprob(&self) -> bool {
        self.logprobs.is_some() || self.ranks_candidates()
    }

    /// Builds parameters from raw caller values, checking each field and the cross-field rule
    /// `min_tokens <= max_tokens`. Values arrive as `i64` so that negative or huge inputs get a
    /// range error naming the field rather than an integer-conversion error.
    pub fn new(
        n: i64,
        max_tokens: Option<i64>,
        min_tokens: i64,
        ignore_eos: bool,
        stop_token_ids: Vec<TokenId>,
    ) -> CoreResult<Self> {
        let n = in_range("n", n, 1, i64::from(MAX_N))?;
        let max_tokens = max_tokens
            .map(|m| in_range("max_tokens", m, 1, i64::from(u32::MAX)))
            .transpose()?;
        let min_tokens = in_range("min_tokens", min_tokens, 0, i64::from(u32::MAX))?;
        if let Some(max) = max_tokens {
            if min_tokens > max {
                return Err(CoreError::invalid(
                    "min_tokens",
                    "out_of_range",
                    format!("`min_tokens` must be <= `max_tokens` ({max}); got {min_tokens}"),
                ));
            }
        }
        Ok(SamplingParams {
            n,
            best_of: n,
            max_tokens,
            min_tokens,
            ignore_eos,
            stop_token_ids,
            ..SamplingParams::default()
        })
    }
}

/// Checks `min <= value <= max` and narrows to `u32` (callers keep `max <= u32::MAX`).
fn in_range(param: &'static str, value: i64, min: i64, max: i64) -> CoreResult<u32> {
    if value < min || value > max {
        let rule = if max == i64::from(u32::MAX) {
            format!("at least {min}")
        } else {
            format!("in [{min}, {max}]")
        };
        return Err(CoreError::invalid(
            param,
            "out_of_range",
            format!("`{param}` must be {rule}; got {value}"),
        ));
    }
    Ok(value as u32)
}

/// Checks a request priority: 1 (highest) to 5 (lowest, the default).
pub fn check_priority(priority: i64) -> CoreResult<u8> {
    Ok(in_range("priority", priority, 1, 5)? as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_boundaries_and_rejects_each_rule() {
        assert!(SamplingParams::new(1, Some(1), 1, false, vec![]).is_ok());
        assert!(SamplingParams::new(MAX_N.into(), None, 1000, true, vec![7]).is_ok());
        let cases: [(i64, Option<i64>, i64, &str); 7] = [
            (0, None, 0, "n"),
            (i64::from(MAX_N) + 1, None, 0, "n"),
            (-1, None, 0, "n"),
            (1, Some(0), 0, "max_tokens"),
            (1, Some(1 << 40), 0, "max_tokens"),
            (1, None, -1, "min_tokens"),
            (1, Some(4), 5, "min_tokens"),
        ];
        for (n, max_tokens, min_tokens, field) in cases {
            match SamplingParams::new(n, max_tokens, min_tokens, false, vec![]) {
                Err(CoreError::Invalid { param, message, .. }) => {
                    assert_eq!(param, field);
                    assert!(message.contains(&format!("`{field}`")), "{message}");
                }
                other => panic!("expected an error on `{field}`, got {other:?}"),
            }
        }
        assert_eq!(check_priority(1), Ok(1));
        assert_eq!(check_priority(5), Ok(5));
        assert!(
            check_priority(0).is_err() && check_priority(6).is_err() && check_priority(-3).is_err()
        );
    }
}
