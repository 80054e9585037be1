//! Request intake: `add_request` resolves a [`NewRequest`]'s defaults (priority from its
//! parameters, deadline from `timeout_s`, the cache salt's prefix-cache key, a seed for an
//! unseeded request), checks it against the scheduler's limits and the model's vocabulary, and
//! queues its first sequence.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::beam::BeamGroup;
use super::request::{Request, Sequence};
use super::scheduler::Scheduler;
use super::speculative::client_draft;
use super::text::text_state_for;
use crate::error::{CoreError, CoreResult};
use crate::grammar::GrammarState;
use crate::params::{check_priority, SamplingParams};
use crate::sampling::check_fits_vocab;
use crate::types::{RequestId, SeqStatus, TokenId};

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
        }
    }
}

/// Where unseeded requests get their seeds: the OS (a fresh `RandomState` per scheduler), or a
/// configured seed, from which the seeds follow deterministically (by request id and order of
/// arrival), so that a whole run replays.
#[derive(Debug)]
pub(crate) enum SeedSource {
    Os(RandomState),
    Fixed(u64),
}

impl SeedSource {
    pub fn new(seed: Option<u64>) -> Self {
        seed.map_or_else(|| SeedSource::Os(RandomState::new()), SeedSource::Fixed)
    }

    /// The seed of the `num_added`-th request added, whose id is `req_id`.
    fn seed_for(&self, req_id: RequestId, num_added: u64) -> u64 {
        match self {
            SeedSource::Os(state) => state.hash_one((req_id.0, num_added)),
            SeedSource::Fixed(seed) => {
                let mut key = [0u8; 16];
                key[..8].copy_from_slice(&req_id.0.to_le_bytes());
                key[8..].copy_from_slice(&num_added.to_le_bytes());
                xxh3_64_with_seed(&key, *seed)
            }
        }
    }
}

/// What `add_request` resolved of a [`NewRequest`].
struct Resolved {
    priority: u8,
    deadline: Option<f64>,
    extra_key: Option<Arc<str>>,
}

impl Scheduler {
    /// Queues a request. Fails, queueing nothing, on a reused id, an empty or too-long prompt, a
    /// bad priority, arrival time or deadline, `n` or `best_of` above `max_num_seqs`, parameters
    /// or prompt tokens that do not fit a known `vocab_size`, stop strings without a tokenizer,
    /// or a full waiting queue (`QueueFull`). The request's first sequence holds a seat for each
    /// of its `best_of` candidates until it forks into them.
    pub fn add_request(&mut self, req: NewRequest) -> CoreResult<()> {
        let r = self.check_new_request(&req)?;
        let (mut text, token_stops) = text_state_for(self.detok.as_deref(), &req.params)?;
        let beam = req.params.use_beam_search.then(|| {
            let num_prompt = req.prompt_token_ids.len();
            let room = self.cfg.max_model_len - num_prompt;
            let max_new = req.params.max_tokens.map_or(room, |m| room.min(m as usize));
            Box::new(BeamGroup::new(
                &req.params,
                &self.cfg.eos_token_ids,
                max_new,
            ))
        });
        if beam.is_some() {
            // A beam's text is decoded once its hypothesis is chosen (`beam::emit_hypothesis`).
            text = None;
        }
        self.num_added += 1;
        let seed = req
            .params
            .seed
            .unwrap_or_else(|| self.seeds.seed_for(req.id, self.num_added));
        let key = self.insert_seq(Sequence {
            req_id: req.id,
            seq_index: 0,
            priority: r.priority,
            arrival: req.arrival_time,
            num_prompt_tokens: req.prompt_token_ids.len(),
            tokens: req.prompt_token_ids,
            num_computed_tokens: 0,
            block_table: Vec::new(),
            block_hashes: Vec::new(),
            num_cached_blocks: 0,
            seats: req.params.num_candidates() as usize,
            extra_key: r.extra_key,
            params: req.params,
            status: SeqStatus::Waiting,
            finish: None,
            seed,
            text,
            token_stops,
            beam: None,
            grammar: req.grammar.map(Box::new),
            draft: client_draft(req.draft_tokens, req.draft_logits),
        });
        self.waiting
            .push_back(key, r.priority, req.arrival_time, req.id.0, 0);
        self.num_deadlines += usize::from(r.deadline.is_some());
        let request = Request {
            deadline: r.deadline,
            seqs: vec![key],
            beam,
        };
        self.requests.insert(req.id, request);
        Ok(())
    }

    fn check_new_request(&self, req: &NewRequest) -> CoreResult<Resolved> {
        if self.requests.contains_key(&req.id) {
            let msg = format!(
                "`request_id` {} is already in use by an unfinished request",
                req.id.0
            );
            return Err(CoreError::invalid("request_id", "duplicate", msg));
        }
        if self.cfg.prefill_only {
            self.check_prefill_request(req)?;
        }
        self.check_prompt(&req.prompt_token_ids, req.num_virtual_tokens)?;
        let priority = check_priority(req.priority.unwrap_or(i64::from(req.params.priority)))?;
        if !req.arrival_time.is_finite() {
            return Err(not_finite("arrival_time"));
        }
        let deadline = req
            .deadline
            .or(req.params.timeout_s.map(|t| req.arrival_time + t));
        if deadline.is_some_and(|d| !d.is_finite()) {
            return Err(not_finite("deadline"));
        }
        self.check_params(&req.params)?;
        if req.grammar.is_some() && req.params.ignore_eos {
            return Err(CoreError::invalid(
                "ignore_eos",
                "conflict",
                "`ignore_eos` cannot be used with a grammar (structured output ends where the grammar does)",
            ));
        }
        self.check_draft(req)?;
        if req.params.use_beam_search {
            self.check_beam_fits(&req.params, req.prompt_token_ids.len())?;
        }
        if self.waiting.len() >= self.cfg.max_num_waiting {
            return Err(CoreError::QueueFull {
                max_num_waiting: self.cfg.max_num_waiting,
            });
        }
        let extra_key = req
            .cache_salt
            .as_ref()
            .map(|s| Arc::<str>::from(format!("salt:{s}")));
        Ok(Resolved {
            priority,
            deadline,
            extra_key,
        })
    }

    fn check_prompt(&self, prompt: &[TokenId], num_virtual: u32) -> CoreResult<()> {
        if prompt.is_empty() {
            return Err(CoreError::invalid(
                "prompt_token_ids",
                "empty",
                "`prompt_token_ids` must contain at least 1 token",
            ));
        }
        if prompt.len() >= self.cfg.max_model_len && !self.cfg.prefill_only {
            let msg = format!(
                "`prompt_token_ids` has {} tokens; it must be shorter than max_model_len ({}) to leave room for output",
                prompt.len(),
                self.cfg.max_model_len
            );
            return Err(CoreError::invalid("prompt_token_ids", "too_long", msg));
        }
        let vocab = self.cfg.vocab_size + num_virtual as usize;
        let beyond = prompt.iter().find(|&&t| t as usize >= vocab);
        if let (true, Some(t)) = (vocab > 0, beyond) {
            let msg = format!(
                "`prompt_token_ids` must be in [0, {vocab}) (the model's vocabulary); got {t}"
            );
            return Err(CoreError::invalid("prompt_token_ids", "out_of_range", msg));
        }
        Ok(())
    }

    fn check_params(&self, params: &SamplingParams) -> CoreResult<()> {
        // Every candidate takes a seat, so the limit is on best_of (>= n) when it is larger.
        let num = params.num_candidates();
        if num as usize > self.cfg.max_num_seqs {
            let field = if params.best_of > params.n {
                "best_of"
            } else {
                "n"
            };
            let msg = format!(
                "`{field}` must be <= max_num_seqs ({}); got {num}",
                self.cfg.max_num_seqs
            );
            return Err(CoreError::invalid(field, "out_of_range", msg));
        }
        if self.cfg.vocab_size > 0 {
            check_fits_vocab(params, self.cfg.vocab_size)?;
        }
        Ok(())
    }
}

fn not_finite(param: &'static str) -> CoreError {
    CoreError::invalid(
        param,
        "not_finite",
        format!("`{param}` must be a finite time in seconds"),
    )
}
