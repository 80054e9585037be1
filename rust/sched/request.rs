//! The typed request both schedulers take ([`NewRequest`]), and the checks and defaults every
//! request gets whichever scheduler queues it (`resolve`).

use std::sync::Arc;

use super::config::SchedulerConfig;
use super::media::{check_media, MediaSpan};
use crate::error::{CoreError, CoreResult};
use crate::grammar::GrammarState;
use crate::params::{check_priority, SamplingParams};
use crate::sampling::check_fits_vocab;
use crate::types::{RequestId, TokenId};

/// A request as the caller hands it over; `add_request` resolves what is left unset.
#[derive(Debug, Clone)]
pub struct NewRequest {
    /// The caller's id, unique among unfinished requests.
    pub id: RequestId,
    /// The prompt; at least one token, shorter than `max_model_len`, below `vocab_size` +
    /// `num_virtual_tokens`.
    pub prompt_token_ids: Vec<TokenId>,
    /// P-tuning: prompt ids in `vocab_size..vocab_size + num_virtual_tokens` are rows of the
    /// request's prompt embedding table (the model runner embeds them; they are never
    /// sampled). Such a request should carry a `cache_salt` naming its table.
    pub num_virtual_tokens: u32,
    /// The validated parameters (shared with the caller).
    pub params: Arc<SamplingParams>,
    /// 1 (highest) .. 5; `None` = `params.priority`.
    pub priority: Option<i64>,
    /// Seconds, on the clock `schedule(now)` uses.
    pub arrival_time: f64,
    /// When the request times out; `None` = `arrival_time + params.timeout_s`, if that is set.
    pub deadline: Option<f64>,
    /// Requests share prefix-cache blocks only with requests of the same salt.
    pub cache_salt: Option<String>,
    /// Constrained decoding: the grammar's initial state (compiled by the caller, off the
    /// engine thread); each of the request's sequences follows its own copy.
    pub grammar: Option<GrammarState>,
    /// Speculative decoding: the client's guess of the output's first tokens, verified by the
    /// model (accepted while the target agrees); empty = none.
    pub draft_tokens: Vec<TokenId>,
    /// Row-major `[draft_tokens.len(), vocab]`: the drafter's logits at each draft token. With
    /// them, a sampled request accepts a draft token with probability `min(1, p/q)`; without,
    /// the draft counts as deterministic (`q` a point mass).
    pub draft_logits: Option<Vec<f32>>,
    /// The LoRA adapter the request runs on (0: the base model). The caller numbers adapters
    /// and never reuses a number for other weights: the prefix cache shares blocks only
    /// between requests of the same adapter, and `max_loras` counts distinct numbers.
    pub lora_id: u32,
    /// The prompt's media spans: sorted, non-overlapping, non-empty, within the prompt (empty:
    /// none). Their digests key the prefix cache per block; their lengths count against
    /// `max_num_encoder_tokens` in the step whose chunk first reaches into them.
    pub media: Vec<MediaSpan>,
}

impl NewRequest {
    /// A request with every optional field unset, arriving at time 0.
    pub fn new(id: u64, prompt_token_ids: Vec<TokenId>, params: Arc<SamplingParams>) -> Self {
        NewRequest {
            id: RequestId(id),
            prompt_token_ids,
            num_virtual_tokens: 0,
            params,
            priority: None,
            arrival_time: 0.0,
            deadline: None,
            cache_salt: None,
            grammar: None,
            draft_tokens: Vec::new(),
            draft_logits: None,
            lora_id: 0,
            media: Vec::new(),
        }
    }

    /// Checks what every scheduler checks and resolves the defaults: a prompt of at least one
    /// token, at most `max_prompt_len` when given, within the vocabulary; its media spans; the
    /// priority, arrival time and deadline; parameters that fit `max_num_seqs` and the
    /// vocabulary.
    pub(crate) fn resolve(
        &self,
        cfg: &SchedulerConfig,
        max_prompt_len: Option<usize>,
    ) -> CoreResult<Resolved> {
        self.check_prompt(cfg, max_prompt_len)?;
        check_media(&self.media, self.prompt_token_ids.len())?;
        let priority = check_priority(self.priority.unwrap_or(i64::from(self.params.priority)))?;
        if !self.arrival_time.is_finite() {
            return Err(not_finite("arrival_time"));
        }
        let deadline = self
            .deadline
            .or(self.params.timeout_s.map(|t| self.arrival_time + t));
        if deadline.is_some_and(|d| !d.is_finite()) {
            return Err(not_finite("deadline"));
        }
        check_params(cfg, &self.params)?;
        let salt = self.cache_salt.as_ref().map(|s| format!("salt:{s}"));
        let extra_key = match (self.lora_id, salt) {
            (0, salt) => salt.map(Arc::<str>::from),
            (lora, None) => Some(Arc::from(format!("lora:{lora}"))),
            (lora, Some(salt)) => Some(Arc::from(format!("lora:{lora}|{salt}"))),
        };
        Ok(Resolved {
            priority,
            deadline,
            extra_key,
        })
    }

    fn check_prompt(&self, cfg: &SchedulerConfig, max_len: Option<usize>) -> CoreResult<()> {
        let prompt = &self.prompt_token_ids;
        if prompt.is_empty() {
            return Err(CoreError::invalid(
                "prompt_token_ids",
                "empty",
                "`prompt_token_ids` must contain at least 1 token",
            ));
        }
        if max_len.is_some_and(|max| prompt.len() > max) {
            let msg = format!(
                "`prompt_token_ids` has {} tokens; it must be shorter than max_model_len ({}) to leave room for output",
                prompt.len(),
                cfg.max_model_len
            );
            return Err(CoreError::invalid("prompt_token_ids", "too_long", msg));
        }
        let vocab = cfg.vocab_size + self.num_virtual_tokens as usize;
        let beyond = prompt.iter().find(|&&t| t as usize >= vocab);
        if let (true, Some(t)) = (vocab > 0, beyond) {
            let msg = format!(
                "`prompt_token_ids` must be in [0, {vocab}) (the model's vocabulary); got {t}"
            );
            return Err(CoreError::invalid("prompt_token_ids", "out_of_range", msg));
        }
        Ok(())
    }
}

/// What `resolve` made of a [`NewRequest`].
#[derive(Debug)]
pub(crate) struct Resolved {
    pub priority: u8,
    pub deadline: Option<f64>,
    /// The prefix-cache key of its salt.
    pub extra_key: Option<Arc<str>>,
}

fn check_params(cfg: &SchedulerConfig, params: &SamplingParams) -> CoreResult<()> {
    // Every candidate takes a seat, so the limit is on best_of (>= n) when it is larger.
    let num = params.num_candidates();
    if num as usize > cfg.max_num_seqs {
        let field = if params.best_of > params.n {
            "best_of"
        } else {
            "n"
        };
        let msg = format!(
            "`{field}` must be <= max_num_seqs ({}); got {num}",
            cfg.max_num_seqs
        );
        return Err(CoreError::invalid(field, "out_of_range", msg));
    }
    if cfg.vocab_size > 0 {
        check_fits_vocab(params, cfg.vocab_size)?;
    }
    Ok(())
}

fn not_finite(param: &'static str) -> CoreError {
    CoreError::invalid(
        param,
        "not_finite",
        format!("`{param}` must be a finite time in seconds"),
    )
}
