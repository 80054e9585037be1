//! Server and model limits that validation checks requests against
//! (docs/serving.md#requests-and-limits, docs/api/common.md#prompt-limits,
//! docs/api/common.md#output-cap), and the two pieces of arithmetic every route shares: the
//! prompt-token limit and the output cap.

use crate::error::{CoreError, CoreResult};
use crate::params::{MAX_LOGPROBS, MAX_N};

use super::codes;

/// The hard token cap (docs/api/common.md#prompt-limits; "1MB" of tokens,
/// docs/decisions.md#character-and-token-caps).
pub const MAX_PROMPT_TOKENS_CAP: u32 = 1 << 20;

/// A Databricks endpoint's billing type, which decides whether `n` and `error_behavior` are
/// accepted (docs/api/databricks.md#chat-request, docs/api/databricks.md#error-behavior,
/// docs/decisions.md#endpoint-types).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum EndpointType {
    /// Pay-per-token: `error_behavior` is accepted, `n` > 1 is not.
    PayPerToken,
    /// Provisioned throughput: `n` is accepted, `error_behavior` other than "error" is not.
    ProvisionedThroughput,
}

impl EndpointType {
    /// Parses the configuration spelling, "pay_per_token" or "provisioned_throughput".
    pub fn parse(name: &str) -> CoreResult<EndpointType> {
        match name {
            "pay_per_token" => Ok(EndpointType::PayPerToken),
            "provisioned_throughput" => Ok(EndpointType::ProvisionedThroughput),
            _ => Err(CoreError::invalid(
                "databricks_endpoint_type",
                codes::INVALID_VALUE,
                format!("`databricks_endpoint_type` must be \"pay_per_token\" or \"provisioned_throughput\"; got {name:?}"),
            )),
        }
    }

    /// The configuration spelling (the inverse of [`EndpointType::parse`]).
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointType::PayPerToken => "pay_per_token",
            EndpointType::ProvisionedThroughput => "provisioned_throughput",
        }
    }
}

/// What the deployment allows. Built once at start-up from the server configuration and the
/// model's `config.json`; [`Limits::validate`] must pass before the limits are used.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// `maxSeqLen`: prompt plus generated tokens of one sequence, at most.
    pub max_model_len: u32,
    /// `maxInputTokenLen`: prompt tokens, at most.
    pub max_input_tokens: u32,
    /// `max_position_embeddings` of the model's `config.json`; `None` leaves it out of the
    /// prompt-token minimum.
    pub max_position_embeddings: Option<u32>,
    /// `maxIterTimes`: generated tokens per request, at most, and the `/v1` default
    /// `max_tokens`.
    pub max_iter_times: u32,
    /// Vocabulary size; 0 = unknown, which turns off the checks that need it (token ids below
    /// the vocabulary, `embedding_bias` length, top-k clamping).
    pub vocab_size: u32,
    /// Prompt text characters (Unicode code points), at most (4 MiB,
    /// docs/decisions.md#character-and-token-caps).
    pub max_prompt_chars: u32,
    /// Characters of all stop strings together, at most.
    pub max_stop_chars: u32,
    /// Largest `n` and `best_of`.
    pub max_n: u32,
    /// Largest `top_logprobs` (chat) and offline `logprobs`.
    pub max_logprobs: u32,
    /// Largest number of tools on the Databricks chat route.
    pub max_tools_databricks: u32,
    /// Largest beam width (TRT `beam_width`, and `best_of`/`n` under `use_beam_search`).
    pub max_beam_width: u32,
    /// Whether the model takes media content parts; false rejects them
    /// (docs/api/common.md#content-parts).
    pub multimodal: bool,
    /// The Databricks endpoint's type; `None` accepts both `n` and `error_behavior`.
    pub databricks_endpoint_type: Option<EndpointType>,
    /// The length of an embedding model's vectors, the only `dimensions` `/v1/embeddings`
    /// accepts; 0 = not an embedding model (any positive `dimensions` passes validation).
    pub embedding_dimensions: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_model_len: 8192,
            max_input_tokens: 8192,
            max_position_embeddings: None,
            max_iter_times: 8192,
            vocab_size: 0,
            max_prompt_chars: 4 * 1024 * 1024,
            max_stop_chars: 32 * 1024,
            max_n: MAX_N,
            max_logprobs: MAX_LOGPROBS,
            max_tools_databricks: 32,
            max_beam_width: MAX_N,
            multimodal: false,
            databricks_endpoint_type: None,
            embedding_dimensions: 0,
        }
    }
}

fn check(param: &'static str, value: u32, min: u32, max: u32) -> CoreResult<()> {
    if value < min || value > max {
        return Err(CoreError::invalid(
            param,
            codes::OUT_OF_RANGE,
            format!("`{param}` must be in [{min}, {max}]; got {value}"),
        ));
    }
    Ok(())
}

impl Limits {
    /// Checks every limit: lengths at least 1 (`max_model_len` at least 2, so that a one-token
    /// prompt leaves room for one output token), `max_n` and `max_beam_width` in [1, 128],
    /// `max_logprobs` at most 20.
    pub fn validate(&self) -> CoreResult<()> {
        check("max_model_len", self.max_model_len, 2, u32::MAX)?;
        check("max_input_tokens", self.max_input_tokens, 1, u32::MAX)?;
        if let Some(p) = self.max_position_embeddings {
            check("max_position_embeddings", p, 1, u32::MAX)?;
        }
        check("max_iter_times", self.max_iter_times, 1, u32::MAX)?;
        check("max_prompt_chars", self.max_prompt_chars, 1, u32::MAX)?;
        check("max_stop_chars", self.max_stop_chars, 1, u32::MAX)?;
        check("max_n", self.max_n, 1, MAX_N)?;
        check("max_logprobs", self.max_logprobs, 0, MAX_LOGPROBS)?;
        check("max_beam_width", self.max_beam_width, 1, MAX_N)?;
        Ok(())
    }
}

/// The most prompt tokens a request may have (docs/api/common.md#prompt-limits):
/// `min(max_input_tokens, max_model_len - 1, max_position_embeddings, 1048576)`.
pub fn max_prompt_tokens(limits: &Limits) -> u32 {
    let mut max = limits
        .max_input_tokens
        .min(limits.max_model_len.saturating_sub(1))
        .min(MAX_PROMPT_TOKENS_CAP);
    if let Some(p) = limits.max_position_embeddings {
        max = max.min(p);
    }
    max
}

/// Checks a tokenized prompt (after the chat template, for chat) against
/// docs/api/common.md#prompt-limits: at least one token and at most [`max_prompt_tokens`]. The
/// error names `prompt`.
pub fn check_prompt_tokens(num_prompt_tokens: u32, limits: &Limits) -> CoreResult<()> {
    check_prompt_tokens_of("prompt", num_prompt_tokens, limits)
}

/// [`check_prompt_tokens`] with the route's name for its prompt field.
pub(crate) fn check_prompt_tokens_of(
    param: &str,
    num_prompt_tokens: u32,
    limits: &Limits,
) -> CoreResult<()> {
    if num_prompt_tokens == 0 {
        return Err(CoreError::invalid(
            param,
            codes::EMPTY,
            format!("`{param}` must be at least 1 token; got 0"),
        ));
    }
    let max = max_prompt_tokens(limits);
    if num_prompt_tokens > max {
        let position = limits
            .max_position_embeddings
            .map_or(String::new(), |p| format!(", max_position_embeddings {p}"));
        return Err(CoreError::invalid(
            param,
            codes::TOO_LONG,
            format!(
                "`{param}` must be at most {max} tokens (the least of maxInputTokenLen {}, maxSeqLen - 1 = {}{position}, {MAX_PROMPT_TOKENS_CAP}); got {num_prompt_tokens}",
                limits.max_input_tokens,
                limits.max_model_len.saturating_sub(1),
            ),
        ));
    }
    Ok(())
}

/// docs/api/common.md#output-cap: `min(requested, max_iter_times, max_model_len - prompt_tokens)`,
/// where a missing `requested` (Databricks null) leaves that term out and a missing prompt count
/// leaves out the last term. Never below 1 for a prompt that passed [`check_prompt_tokens`].
pub(crate) fn output_cap(requested: Option<u64>, prompt: Option<u32>, limits: &Limits) -> u32 {
    let mut cap = u64::from(limits.max_iter_times);
    if let Some(r) = requested {
        cap = cap.min(r);
    }
    if let Some(p) = prompt {
        cap = cap.min(u64::from(limits.max_model_len.saturating_sub(p)));
    }
    // `cap` is at most max_iter_times, a u32.
    cap as u32
}
