//! Prefill-only mode (`SchedulerConfig::prefill_only`), for embedding models: a request is one
//! forward over its prompt and nothing is kept after it.
//!
//! - **Packing.** `schedule()` admits waiting requests in rank order (effective priority, then
//!   arrival: the same order as generation) while the step's token budget, its seats
//!   (`max_num_seqs`) and the free blocks last. A request is admitted whole or not at all and
//!   nothing overtakes the head of the queue, so a long input is never starved by short ones.
//! - **No chunking.** An encoder's attention is bidirectional (an input's first token attends
//!   to its last), so an input cannot be split across steps. Instead of chunking, inputs longer
//!   than the budget are refused: the config must have `max_model_len <= max_num_batched_tokens`
//!   and `add_request` refuses a prompt over `max_model_len`. An empty step therefore always
//!   admits the head of the queue, and the caller (the server) refuses longer inputs at
//!   validation with a 400. A decoder run as an embedder follows the same rule (chunking it
//!   would need its KV and pooled state kept across steps, which this mode does not keep).
//! - **Nothing kept.** Every scheduled row ends at the next `update(step_id, [])` (there are no
//!   samples; the plan has no logits rows) with reason `stop`: its blocks are freed and its
//!   request is gone, listed in `StepOutput::finished_req_ids` in row order. The blocks exist
//!   only so that a decoder can write and read its KV during the forward; an encoder ignores
//!   them. Prefix caching is refused (a block's hidden states depend on later tokens).
//! - Aborts and deadlines end waiting requests at the next `schedule()` as in generation.

use super::config::SchedulerConfig;
use super::plan::StepOutput;
use super::rank::SeqKey;
use super::schedule::{PlanRecord, Row};
use super::scheduler::Scheduler;
use crate::error::{CoreError, CoreResult};
use crate::types::FinishReason;

use super::intake::NewRequest;

/// The config rules of prefill-only mode (see the module docs).
pub(crate) fn check_config(cfg: &SchedulerConfig) -> CoreResult<()> {
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
    Ok(())
}

impl Scheduler {
    /// What a prefill-only scheduler refuses at `add_request`: a prompt over `max_model_len`
    /// (it would not fit one step), more than one candidate, beam search or a grammar (nothing
    /// is sampled).
    pub(crate) fn check_prefill_request(&self, req: &NewRequest) -> CoreResult<()> {
        let (len, max) = (req.prompt_token_ids.len(), self.cfg.max_model_len);
        if len > max {
            let msg = format!(
                "`prompt_token_ids` has {len} tokens; a prefill-only scheduler takes at most max_model_len ({max}) per input"
            );
            return Err(CoreError::invalid("prompt_token_ids", "too_long", msg));
        }
        let p = &req.params;
        let refused = if p.use_beam_search {
            Some("use_beam_search")
        } else if p.n > 1 {
            Some("n")
        } else if p.best_of > 1 {
            Some("best_of")
        } else if req.grammar.is_some() {
            Some("grammar")
        } else {
            None
        };
        match refused {
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

    /// Admits waiting requests whole, in rank order, while `budget`, seats and blocks last.
    pub(crate) fn admit_prefill(&mut self, now: f64, budget: &mut usize, rows: &mut Vec<Row>) {
        let aging = self.cfg.priority_aging_s;
        while let Some((key, _)) = self.waiting.peek(now, aging) {
            let s = self.seq(key);
            let num_tokens = s.tokens.len();
            let blocks = num_tokens.div_ceil(self.cfg.block_size);
            if num_tokens > *budget
                || self.num_running_seats + s.seats > self.cfg.max_num_seqs
                || self.pool.num_free() < blocks
            {
                break;
            }
            let admitted = self.admit(key, &[], *budget, false);
            debug_assert_eq!(admitted, num_tokens, "admitted whole");
            rows.push(Row {
                key,
                num_tokens,
                copy: None,
            });
            *budget -= num_tokens;
        }
    }

    /// Ends every row of the step: blocks freed, requests gone (in row order).
    pub(crate) fn finish_prefill(&mut self, rec: &PlanRecord) -> StepOutput {
        let keys: Vec<SeqKey> = rec.rows.iter().map(|r| r.key).collect();
        for key in keys {
            self.finish_seq(key, FinishReason::Stop);
        }
        StepOutput {
            text_offsets: vec![0],
            logprob_byte_offsets: vec![0],
            finished_req_ids: self.drop_finished().into_iter().map(|id| id.0).collect(),
            ..StepOutput::default()
        }
    }
}
