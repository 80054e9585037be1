//! `PrefillScheduler`: prefill-only scheduling, for embedding models. A request is one forward
//! over its prompt and nothing is kept after it, so this is a small scheduler of its own over
//! the block pool and the waiting queue, with none of the generation scheduler's sequences,
//! samples or behaviours.
//!
//! - **Packing.** `schedule()` admits waiting inputs in rank order (effective priority, then
//!   arrival: the same order as generation) while the step's token budget, its seats
//!   (`max_num_seqs`) and the free blocks last. An input is admitted whole or not at all and
//!   nothing overtakes the head of the queue, so a long input is never starved by short ones.
//! - **No chunking.** An encoder's attention is bidirectional (an input's first token attends
//!   to its last), so an input cannot be split across steps. Instead of chunking, inputs longer
//!   than the budget are refused: the config must have `max_model_len <= max_num_batched_tokens`
//!   and `add_request` refuses a prompt over `max_model_len`. An empty step therefore always
//!   admits the head of the queue, and the caller (the server) refuses longer inputs at
//!   validation with a 400. A decoder run as an embedder follows the same rule (chunking it
//!   would need its KV and pooled state kept across steps, which this scheduler does not keep).
//! - **Nothing kept.** Every scheduled row ends at the next `update(step_id, [])` (there are no
//!   samples; the plan has no logits rows) with reason `stop`: its blocks are freed and its
//!   request is gone, listed in `StepOutput::finished_req_ids` in row order. The blocks exist
//!   only so that a decoder can write and read its KV during the forward; an encoder ignores
//!   them. Prefix caching is refused (a block's hidden states depend on later tokens). A plan
//!   never passed to `update()` is planned again by the next `schedule()`.
//! - Aborts and deadlines end inputs at the next `schedule()` as in generation.

use rustc_hash::FxHashMap;

use super::behaviour::sampling_field;
use super::config::SchedulerConfig;
use super::endings::Endings;
use super::output::StepOutput;
use super::plan::{RowSpec, StepPlan};
use super::queue::WaitingQueue;
use super::rank::SeqKey;
use super::request::NewRequest;
use super::slab::Slab;
use super::stats::SchedulerStats;
use crate::error::{CoreError, CoreResult};
use crate::kv::BlockPool;
use crate::types::{BlockId, RequestId, TokenId};

/// One queued input.
#[derive(Debug)]
struct Input {
    req_id: RequestId,
    priority: u8,
    deadline: Option<f64>,
    tokens: Vec<TokenId>,
    /// Its KV blocks while it is in a plan.
    block_table: Vec<BlockId>,
}

/// The prefill-only scheduler. See the module docs for the policy.
#[derive(Debug)]
pub struct PrefillScheduler {
    cfg: SchedulerConfig,
    pool: BlockPool,
    inputs: Slab<Input>,
    ids: FxHashMap<RequestId, SeqKey>,
    waiting: WaitingQueue,
    /// Inputs holding blocks: the rows of the plan awaiting `update()`, in row order.
    running: Vec<SeqKey>,
    /// Aborts asked for and deadlines to watch.
    endings: Endings,
    step: u64,
    /// The step id of the plan awaiting `update()`.
    last: Option<u64>,
}

impl PrefillScheduler {
    /// A scheduler with an empty pool of `cfg.num_blocks` blocks. Besides `cfg.validate()`, it
    /// needs `max_model_len <= max_num_batched_tokens` (so every admissible input fits one
    /// step), no prefix caching and no speculative decoding.
    pub fn new(cfg: SchedulerConfig) -> CoreResult<Self> {
        cfg.validate()?;
        check_config(&cfg)?;
        Ok(PrefillScheduler {
            pool: BlockPool::new(cfg.num_blocks, cfg.block_size),
            cfg,
            inputs: Slab::new(),
            ids: FxHashMap::default(),
            waiting: WaitingQueue::default(),
            running: Vec::new(),
            endings: Endings::default(),
            step: 0,
            last: None,
        })
    }

    /// The configuration this scheduler was built with.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// The block pool (read-only).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Queues an input. Fails, queueing nothing, on a reused id, a prompt that is empty, over
    /// `max_model_len` or beyond a known vocabulary, what needs sampling (more than one
    /// candidate, a grammar, draft tokens: nothing is sampled), a bad priority, arrival time
    /// or deadline, or a full waiting queue (`QueueFull`).
    pub fn add_request(&mut self, req: NewRequest) -> CoreResult<()> {
        if self.ids.contains_key(&req.id) {
            let msg = format!(
                "`request_id` {} is already in use by an unfinished request",
                req.id.0
            );
            return Err(CoreError::invalid("request_id", "duplicate", msg));
        }
        self.check_prefill_request(&req)?;
        let r = req.resolve(&self.cfg, None)?;
        if self.waiting.len() >= self.cfg.max_num_waiting {
            return Err(CoreError::QueueFull {
                max_num_waiting: self.cfg.max_num_waiting,
            });
        }
        let input = Input {
            req_id: req.id,
            priority: r.priority,
            deadline: r.deadline,
            tokens: req.prompt_token_ids,
            block_table: Vec::new(),
        };
        let key = self.inputs.insert(input);
        self.waiting
            .push_back(key, r.priority, req.arrival_time, req.id.0, 0);
        self.endings.added(r.deadline);
        self.ids.insert(req.id, key);
        Ok(())
    }

    /// What a prefill-only scheduler refuses at `add_request` beyond every scheduler's checks:
    /// a prompt over `max_model_len` (it would not fit one step), and whatever samples.
    fn check_prefill_request(&self, req: &NewRequest) -> CoreResult<()> {
        let (len, max) = (req.prompt_token_ids.len(), self.cfg.max_model_len);
        if len > max {
            let msg = format!(
                "`prompt_token_ids` has {len} tokens; a prefill-only scheduler takes at most max_model_len ({max}) per input"
            );
            return Err(CoreError::invalid("prompt_token_ids", "too_long", msg));
        }
        if req.lora_id != 0 {
            let msg = "`lora_id`: a prefill-only scheduler runs the base model only";
            return Err(CoreError::invalid(
                "lora_id",
                "unsupported",
                msg.to_string(),
            ));
        }
        match sampling_field(req) {
            Some(field) => Err(CoreError::invalid(
                field,
                "unsupported",
                format!(
                    "`{field}` is not supported by a prefill-only scheduler: it samples nothing"
                ),
            )),
            None => Ok(()),
        }
    }

    /// Marks an input for abort; it ends (reason abort) at the next `schedule()`. Returns false
    /// if no unfinished input has this id.
    pub fn abort_request(&mut self, req_id: RequestId) -> bool {
        self.ids.contains_key(&req_id) && self.endings.abort(req_id)
    }

    /// Whether any input is waiting or in a plan.
    pub fn has_unfinished_requests(&self) -> bool {
        !self.ids.is_empty()
    }

    /// Plans the next step at time `now`: aborted and expired inputs end, then the inputs of a
    /// plan never updated, then waiting inputs whole in rank order while budget, seats and
    /// blocks last.
    pub fn schedule(&mut self, now: f64) -> StepPlan {
        self.step += 1;
        let mut plan = StepPlan::new(self.step);
        self.end_aborted_and_expired(now, &mut plan);
        let mut budget = self.cfg.max_num_batched_tokens;
        for &key in &self.running {
            budget -= self.input(key).tokens.len();
        }
        let aging = self.cfg.priority_aging_s;
        while let Some((key, _)) = self.waiting.peek(now, aging) {
            let input = self.input(key);
            let num_tokens = input.tokens.len();
            if num_tokens > budget
                || self.running.len() >= self.cfg.max_num_seqs
                || self.pool.num_free() < num_tokens.div_ceil(self.cfg.block_size)
            {
                break;
            }
            self.waiting.pop(key, input.priority);
            let input = self.inputs[key as usize].as_mut().expect("queued");
            self.pool.allocate_into(
                num_tokens.div_ceil(self.cfg.block_size),
                &mut input.block_table,
            );
            self.running.push(key);
            budget -= num_tokens;
        }
        for (r, &key) in self.running.iter().enumerate() {
            let input = self.input(key);
            let spec = RowSpec {
                req_id: input.req_id,
                seq_index: 0,
                tokens: &input.tokens,
                num_prompt_tokens: input.tokens.len(),
                num_computed_tokens: 0,
                num_tokens: input.tokens.len(),
                lookahead: &[],
                block_table: &input.block_table,
                num_samples_at_end: 0,
                lora_id: 0,
            };
            plan.push_row(&spec, self.cfg.block_size, r as i32);
        }
        let inputs = &self.inputs;
        plan.fill_block_tables(self.running.iter().map(|&k| {
            let input = inputs[k as usize].as_ref().expect("running");
            &input.block_table[..]
        }));
        self.last = Some(plan.step_id);
        plan
    }

    /// Ends every row of the plan `step_id`, which must be the last one `schedule()` returned
    /// (`sampled_token_ids` must be empty: the plan has no samples): blocks freed, requests
    /// gone, listed in row order.
    pub fn update(
        &mut self,
        step_id: u64,
        sampled_token_ids: &[TokenId],
    ) -> CoreResult<StepOutput> {
        if self.last != Some(step_id) {
            return Err(CoreError::StalePlan {
                got: step_id,
                expected: self.last.unwrap_or(self.step + 1),
            });
        }
        if !sampled_token_ids.is_empty() {
            return Err(CoreError::invalid(
                "sampled_token_ids",
                "wrong_length",
                format!(
                    "`sampled_token_ids` must have one token per sample of the plan (0); got {}",
                    sampled_token_ids.len()
                ),
            ));
        }
        self.last = None;
        let mut out = StepOutput::with_width(0);
        for key in std::mem::take(&mut self.running) {
            out.finished_req_ids.push(self.remove(key).0);
        }
        Ok(out)
    }

    /// Counters and gauges (those of generation that apply).
    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            num_running_seqs: self.running.len(),
            num_waiting_seqs: self.waiting.len(),
            num_unfinished_requests: self.ids.len(),
            num_free_blocks: self.pool.num_free(),
            num_used_blocks: self.pool.num_blocks() - 1 - self.pool.num_free(),
            num_steps: self.step,
            ..SchedulerStats::default()
        }
    }

    /// Checks that exactly the inputs of the pending plan hold blocks, each as many as its
    /// tokens need, that the free list holds every other block, and that every input is in
    /// exactly one place. Returns the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let bs = self.cfg.block_size;
        let mut held = 0;
        for &k in &self.running {
            let input = self.inputs[k as usize]
                .as_ref()
                .ok_or(format!("running slot {k} is empty"))?;
            if input.block_table.len() != input.tokens.len().div_ceil(bs) {
                return Err(format!(
                    "input {k} holds {} blocks",
                    input.block_table.len()
                ));
            }
            held += input.block_table.len();
        }
        let num_waiting = self.waiting.iter().count();
        if self
            .waiting
            .iter()
            .any(|k| !self.input(k).block_table.is_empty())
        {
            return Err("a waiting input holds blocks".into());
        }
        if held + self.pool.num_free() != self.pool.num_blocks() - 1 {
            return Err(format!(
                "{held} blocks held, {} free, of {}",
                self.pool.num_free(),
                self.pool.num_blocks() - 1
            ));
        }
        if num_waiting + self.running.len() != self.ids.len() {
            return Err("inputs and queues disagree".into());
        }
        Ok(())
    }

    fn input(&self, key: SeqKey) -> &Input {
        self.inputs[key as usize].as_ref().expect("live input")
    }

    /// Ends aborted inputs and those past their deadline, freeing their blocks.
    fn end_aborted_and_expired(&mut self, now: f64, plan: &mut StepPlan) {
        let inputs = &self.inputs;
        let deadlines = self.ids.iter().map(|(&id, &key)| {
            let input = inputs[key as usize].as_ref().expect("live input");
            (id, input.deadline)
        });
        let ended = self.endings.due(now, deadlines);
        for &(id, reason) in &ended {
            let key = self.ids[&id];
            self.running.retain(|&k| k != key);
            self.waiting.retain(|k| k != key);
            self.remove(key);
            plan.push_finished(id, reason);
        }
    }

    /// Drops an input (from no queue), freeing its blocks.
    fn remove(&mut self, key: SeqKey) -> RequestId {
        let input = self.inputs.remove(key).expect("live input");
        self.pool.free(&input.block_table);
        self.ids.remove(&input.req_id);
        self.endings.removed(input.req_id, input.deadline);
        input.req_id
    }
}

/// The config rules of prefill-only scheduling (see the module docs).
fn check_config(cfg: &SchedulerConfig) -> CoreResult<()> {
    if cfg.enable_prefix_caching {
        return Err(CoreError::invalid(
            "enable_prefix_caching",
            "conflict",
            "`enable_prefix_caching` must be false with `prefill_only` (nothing is kept after a prefill-only forward)",
        ));
    }
    if cfg.max_model_len > cfg.max_num_batched_tokens {
        return Err(CoreError::invalid(
            "max_num_batched_tokens",
            "too_small",
            format!(
                "`max_num_batched_tokens` must be at least `max_model_len` ({}) with `prefill_only`: an input is never split across steps; got {}",
                cfg.max_model_len, cfg.max_num_batched_tokens
            ),
        ));
    }
    if cfg.speculative.is_some() {
        return Err(CoreError::invalid(
            "speculative",
            "conflict",
            "`speculative` needs decode steps; a prefill-only (embedding) scheduler has none",
        ));
    }
    Ok(())
}
