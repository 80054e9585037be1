//! The sampler: one step's logits in, one token per sample out.
//!
//! The engine hands over a float32 row-major buffer `[num_rows, vocab]` and, per sample, the row
//! it draws from (the `n` forks of a request share one row at their first token), its
//! [`SamplingParams`] and its token history. Rows run in parallel on rayon and results are the
//! same bits as a serial run. The logits are read-only: a worker copies its row into a reusable
//! scratch buffer, except for greedy and top-k rows whose processors are all sparse, which read
//! the row in place with the touched tokens in a small overlay (`overlay`). Consecutive samples
//! with the same row, parameters and history (forks) share one filtered distribution. A NaN
//! logit counts as `-inf`; with a `+inf` logit the `+inf` tokens share all the probability.
//!
//! # Order of operations
//! 1. `logit_bias` (sparse) and `embedding_bias` (dense, one value per vocabulary entry) added;
//! 2. `allowed_token_ids`: every other token -> `-inf`; likewise a grammar's mask
//!    (`SampleRequest::allowed`, constrained decoding);
//! 3. `bad_words`: a word's last token -> `-inf` when the rest of it is the output's tail (a
//!    one-token bad word is always banned);
//! 4. `min_tokens`: while `output.len() < min_tokens`, the EOS ids and `stop_token_ids` -> `-inf`;
//! 5. `no_repeat_ngram_size` = n: a token that would complete an n-gram already present is
//!    banned. Like HF's `NoRepeatNGramLogitsProcessor`, which sees the whole `input_ids`, the
//!    n-grams are those of prompt ++ output (so a prompt's phrases are not repeated verbatim);
//! 6. `repetition_penalty` over the distinct tokens of prompt and output: positive logits
//!    divided, the others multiplied (HF, vLLM);
//! 7. `presence_penalty`, `frequency_penalty` over the output (OpenAI):
//!    `logit -= frequency_penalty * count + presence_penalty * (count > 0)`;
//! 8. temperature: logits divided by it. Greedy rows (temperature 0, or top-k 1) take the
//!    argmax after steps 1-7, ties to the lowest id, and skip everything below;
//! 9. top-k (0 or >= vocab = off): the k most probable tokens, ties by the lower id (so top-k 1
//!    is exactly greedy; HF and vLLM keep every token tied with the k-th instead);
//! 10. top-p (1 = off): the smallest set of most probable tokens whose probability reaches
//!     `top_p`, at least one (the rule of HF and vLLM, which remove tokens whose ascending
//!     cumulative mass is at most `1 - top_p`);
//! 11. min-p (0 = off): tokens with `p >= min_p * p_max` stay;
//! 12. typical-p (1 = off), HF `TypicalLogitsWarper`: tokens ranked by `|-log p - entropy|`,
//!     the shortest prefix whose mass reaches `typical_p`, plus ties of its last score.
//!
//! Steps 9-12 each see the distribution the previous one left, renormalised. The draw is an
//! inverse CDF over the kept tokens ranked by descending probability (ties by id), at the
//! uniform [`uniform`]`(seed, sample_index, output.len())`: a pure function of the sample, so a
//! seeded request gets the same tokens whatever else is in the batch and after preemption.
//!
//! # Logprobs
//! Only for `params.logprobs == Some(k)`: the chosen token's logprob and the top `k` tokens by
//! descending logprob, ties by id, padded with the lowest remaining ids at `-inf` when fewer
//! than `k` tokens are possible. [`LogprobsMode`] chooses which distribution they describe.
//! A request that ranks `best_of` > `n` candidates gets the chosen token's logprob even without
//! `logprobs` (and no alternatives): their sum is the candidate's cumulative logprob, in the
//! same mode, as in vLLM (whose `cumulative_logprob` adds up the sampled tokens' logprobs).

mod beam;
mod filters;
mod kernels;
mod logprobs;
mod overlay;
mod processors;
mod rng;
mod run;
mod scratch;
mod select;
mod speculative;

#[cfg(test)]
mod tests;

pub use beam::{beam_candidates, BeamCandidate, BeamRow};
pub use processors::check_fits_vocab;
pub use rng::uniform;
pub use run::{filtered_probs, process_logits, sample, SampleResult};
pub use speculative::{verify_draft, DraftCheck};

use crate::error::{CoreError, CoreResult};
use crate::params::SamplingParams;
use crate::types::TokenId;
use llguidance::toktrie::SimpleVob;

/// One token to draw: which logits row, under which parameters, after which history.
#[derive(Clone, Copy, Debug)]
pub struct SampleRequest<'a> {
    /// Index of the logits row this sample draws from.
    pub row: usize,
    /// The request's parameters.
    pub params: &'a SamplingParams,
    /// The prompt's token ids (repetition penalty, no-repeat n-grams).
    pub prompt: &'a [TokenId],
    /// The tokens this sample generated so far; its length is the draw's position.
    pub output: &'a [TokenId],
    /// The resolved seed (the scheduler draws one per unseeded request). A seeded request does
    /// not mix in its request id, so two requests with the same seed and prompt agree.
    pub seed: u64,
    /// Which of the request's `n` sequences this is; forks of one request draw differently.
    pub sample_index: u32,
    /// The model's EOS ids, banned with `stop_token_ids` while `output.len() < min_tokens`.
    pub eos_token_ids: &'a [TokenId],
    /// The tokens a grammar allows next (constrained decoding); every other token, ids beyond
    /// the mask included, is banned. `None` = unconstrained.
    pub allowed: Option<&'a SimpleVob>,
}

/// A drawn token.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    /// The token.
    pub token: TokenId,
    /// Its logprob; `None` unless `params.logprobs` is set or the request ranks candidates
    /// (`SamplingParams::needs_token_logprob`).
    pub logprob: Option<f32>,
    /// The top `k` (token, logprob) pairs, descending logprob, ties by id; empty unless
    /// `params.logprobs == Some(k)`.
    pub top_logprobs: Vec<(TokenId, f32)>,
}

/// Which distribution logprobs describe.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogprobsMode {
    /// The log-softmax of the unprocessed row, before any processor (vLLM v1's default): what
    /// the model thinks, whatever the request's penalties and filters.
    #[default]
    Raw,
    /// The distribution actually sampled from, after the processors, temperature and filters;
    /// filtered tokens are at `-inf`. Greedy rows report the log-softmax after steps 1-7.
    Processed,
}

impl LogprobsMode {
    /// The mode named `name` ("raw" or "processed"); the error names `logprobs_mode`.
    pub fn parse(name: &str) -> CoreResult<Self> {
        match name {
            "raw" => Ok(LogprobsMode::Raw),
            "processed" => Ok(LogprobsMode::Processed),
            other => Err(CoreError::invalid(
                "logprobs_mode",
                "invalid_choice",
                format!("`logprobs_mode` must be \"raw\" or \"processed\"; got {other:?}"),
            )),
        }
    }

    /// The mode's name, as [`LogprobsMode::parse`] reads it.
    pub fn as_str(self) -> &'static str {
        match self {
            LogprobsMode::Raw => "raw",
            LogprobsMode::Processed => "processed",
        }
    }
}

/// Sampler-wide settings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SamplerConfig {
    /// The distribution logprobs describe.
    pub logprobs_mode: LogprobsMode,
}
