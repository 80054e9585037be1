//! Scheduler limits, checked once when the scheduler is built.

use crate::error::{CoreError, CoreResult};
use crate::sampling::{LogprobsMode, SamplerConfig};
use crate::types::TokenId;

/// Everything that bounds the scheduler. Built once; `validate` names the field that is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// KV blocks in the pool, block 0 (the null block) included.
    pub num_blocks: usize,
    /// Token slots per KV block.
    pub block_size: usize,
    /// Running sequences per step, at most.
    pub max_num_seqs: usize,
    /// Tokens computed per step, at most (the token budget).
    pub max_num_batched_tokens: usize,
    /// Prompt + output tokens of one sequence, at most.
    pub max_model_len: usize,
    /// Waiting sequences (new and preempted) beyond which `add_request` fails with QueueFull.
    pub max_num_waiting: usize,
    /// Reuse KV of full blocks across requests with the same prefix.
    pub enable_prefix_caching: bool,
    /// Seconds of waiting per level of priority gained (see the module docs); 0 turns aging off.
    pub priority_aging_s: f64,
    /// End-of-sequence token ids of the model.
    pub eos_token_ids: Vec<TokenId>,
    /// Which distribution sampled logprobs describe (see [`LogprobsMode`]).
    pub logprobs_mode: LogprobsMode,
    /// The model's vocabulary size (the width of its logits rows); 0 = unknown. When known,
    /// `add_request` rejects prompts and parameters that name tokens beyond it, or carry an
    /// `embedding_bias` of another length, before any work starts.
    pub vocab_size: usize,
    /// Seed of the seeds: when set, unseeded requests draw their seeds deterministically from
    /// it (and their order of arrival), so a whole run is reproducible; `None` = OS-random.
    pub seed: Option<u64>,
    /// Prompt-lookup speculative decoding (`--speculative ngram`); `None` = off.
    pub speculative: Option<NgramConfig>,
    /// Distinct LoRA adapters (`NewRequest::lora_id` other than 0) running at once; 0 = no
    /// limit. A waiting request on another adapter waits until one of them has no sequence
    /// running.
    pub max_loras: usize,
    /// Encoder tokens (media span positions) whose encoding a step may start, at most: a
    /// prefill chunk that would reach into a media span the rest of the step's budget cannot
    /// cover is cut before that span. The first span a step starts is never cut, however long
    /// (so every request makes progress). See [`Self::default_max_num_encoder_tokens`].
    pub max_num_encoder_tokens: usize,
}

/// Prompt-lookup decoding: before each decode step, the scheduler looks for the longest
/// n-gram (`min_n..=max_n` tokens) that ends the sequence and occurred earlier in it, and
/// proposes the up to `num_draft_tokens` tokens that followed that earlier occurrence as a draft
/// (see `sched::speculative`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramConfig {
    /// Shortest n-gram matched (at least 1).
    pub min_n: usize,
    /// Longest n-gram matched (at least `min_n`).
    pub max_n: usize,
    /// Draft tokens proposed per step, at most (at least 1).
    pub num_draft_tokens: usize,
}

impl Default for NgramConfig {
    fn default() -> Self {
        NgramConfig {
            min_n: 1,
            max_n: 3,
            num_draft_tokens: 4,
        }
    }
}

impl NgramConfig {
    /// Checks the ranges; errors name the field.
    pub fn validate(&self) -> CoreResult<()> {
        at_least("ngram_min", self.min_n, 1)?;
        at_least("ngram_max", self.max_n, self.min_n)?;
        at_least("num_speculative_tokens", self.num_draft_tokens, 1)
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            num_blocks: 4096,
            block_size: 16,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            max_model_len: 8192,
            max_num_waiting: 4096,
            enable_prefix_caching: true,
            priority_aging_s: 10.0,
            eos_token_ids: Vec::new(),
            logprobs_mode: LogprobsMode::Raw,
            vocab_size: 0,
            seed: None,
            speculative: None,
            max_loras: 0,
            max_num_encoder_tokens: Self::default_max_num_encoder_tokens(8192),
        }
    }
}

fn at_least(param: &'static str, value: usize, min: usize) -> CoreResult<()> {
    if value < min {
        return Err(CoreError::invalid(
            param,
            "out_of_range",
            format!("`{param}` must be at least {min}; got {value}"),
        ));
    }
    Ok(())
}

/// The least encoder budget by default: room for a few images of a typical vision model (a
/// SmolVLM/Idefics3 image is 64..1088 tokens, a Qwen2-VL one a few hundred) in one step even
/// when `max_num_batched_tokens` is small, as on CPU.
const MIN_DEFAULT_ENCODER_TOKENS: usize = 4096;

impl SchedulerConfig {
    /// `max_num_encoder_tokens` when not given: `max(max_num_batched_tokens, 4096)`. A step
    /// never computes more than `max_num_batched_tokens` positions, so a budget that size
    /// encodes at least what the step can use; the floor keeps small token budgets from
    /// encoding one image at a time.
    pub fn default_max_num_encoder_tokens(max_num_batched_tokens: usize) -> usize {
        max_num_batched_tokens.max(MIN_DEFAULT_ENCODER_TOKENS)
    }

    /// The sampler settings this configuration implies.
    pub fn sampler(&self) -> SamplerConfig {
        SamplerConfig {
            logprobs_mode: self.logprobs_mode,
        }
    }

    /// Checks every field and that one sequence of `max_model_len` tokens fits in the pool.
    pub fn validate(&self) -> CoreResult<()> {
        at_least("num_blocks", self.num_blocks, 2)?;
        if self.num_blocks >= u32::MAX as usize {
            return Err(CoreError::invalid(
                "num_blocks",
                "out_of_range",
                format!(
                    "`num_blocks` must be below {}; got {}",
                    u32::MAX,
                    self.num_blocks
                ),
            ));
        }
        at_least("block_size", self.block_size, 1)?;
        at_least("max_num_seqs", self.max_num_seqs, 1)?;
        at_least("max_num_batched_tokens", self.max_num_batched_tokens, 1)?;
        at_least("max_num_encoder_tokens", self.max_num_encoder_tokens, 1)?;
        at_least("max_model_len", self.max_model_len, 2)?;
        at_least("max_num_waiting", self.max_num_waiting, 1)?;
        if !(self.priority_aging_s >= 0.0 && self.priority_aging_s.is_finite()) {
            return Err(CoreError::invalid(
                "priority_aging_s",
                "out_of_range",
                format!(
                    "`priority_aging_s` must be a finite number >= 0; got {}",
                    self.priority_aging_s
                ),
            ));
        }
        if let Some(ngram) = &self.speculative {
            ngram.validate()?;
        }
        let blocks_per_seq = self.max_model_len.div_ceil(self.block_size);
        if blocks_per_seq > self.num_blocks - 1 {
            return Err(CoreError::invalid(
                "num_blocks",
                "too_small",
                format!(
                    "`num_blocks` must leave room for one sequence of `max_model_len` ({} tokens = {} blocks of {}) besides the null block; got {}",
                    self.max_model_len, blocks_per_seq, self.block_size, self.num_blocks
                ),
            ));
        }
        Ok(())
    }
}
