//! Request intake: `add_request` resolves a [`NewRequest`]'s defaults (priority from its
//! parameters, deadline from `timeout_s`, the cache salt's prefix-cache key, a seed for an
//! unseeded request), checks it against the scheduler's limits, the model's vocabulary and
//! what its behaviours need, and queues its first sequence.

use std::hash::{BuildHasher, RandomState};

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::Scheduler;
use crate::error::{CoreError, CoreResult};
use crate::sched::request::NewRequest;
use crate::sched::seq::{Group, Sequence};
use crate::sched::text::text_state_for;
use crate::types::{RequestId, SeqStatus};

/// Where unseeded requests get their seeds: the OS (a fresh `RandomState` per scheduler), or a
/// configured seed, from which the seeds follow deterministically (by request id and order of
/// arrival), so that a whole run replays.
#[derive(Debug)]
pub(super) enum SeedSource {
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

impl Scheduler {
    /// Queues a request. Fails, queueing nothing, on a reused id, an empty or too-long prompt, a
    /// bad priority, arrival time or deadline, `n` or `best_of` above `max_num_seqs`, parameters
    /// or prompt tokens that do not fit a known `vocab_size`, what its behaviours refuse, stop
    /// strings without a tokenizer, or a full waiting queue (`QueueFull`). The request's first
    /// sequence holds a seat for each sequence it will fork into until it does.
    pub fn add_request(&mut self, mut req: NewRequest) -> CoreResult<()> {
        if self.groups.contains_key(&req.id) {
            let msg = format!(
                "`request_id` {} is already in use by an unfinished request",
                req.id.0
            );
            return Err(CoreError::invalid("request_id", "duplicate", msg));
        }
        let r = req.resolve(&self.cfg, Some(self.cfg.max_model_len - 1))?;
        self.check_behaviours(&req)?;
        if self.waiting.len() >= self.cfg.max_num_waiting {
            return Err(CoreError::QueueFull {
                max_num_waiting: self.cfg.max_num_waiting,
            });
        }
        let (text, token_stops) = text_state_for(self.detok.as_deref(), &req.params)?;
        let start = self.start_behaviours(&mut req);
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
            media: req.media.into(),
            num_encoded_spans: 0,
            lora_id: req.lora_id,
            params: req.params,
            status: SeqStatus::Waiting,
            finish: None,
            seed,
            text: text.filter(|_| start.streams_text),
            token_stops,
            gang: false,
            ext: start.ext,
        });
        self.waiting
            .push_back(key, r.priority, req.arrival_time, req.id.0, 0);
        self.endings.added(r.deadline);
        let group = Group {
            deadline: r.deadline,
            seqs: vec![key],
            behaviour: start.behaviour,
        };
        self.groups.insert(req.id, group);
        Ok(())
    }
}
