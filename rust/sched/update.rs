//! `Scheduler::update()`: apply one step's sampled tokens. Advances computed tokens, offers
//! newly full blocks to the prefix cache, forks `n`-sequence requests after their prompt,
//! appends tokens, applies token-level stops and frees what finished.

use super::plan::StepOutput;
use super::request::{SeqKey, Sequence};
use super::scheduler::Scheduler;
use crate::error::{CoreError, CoreResult};
use crate::types::{FinishReason, SeqStatus, TokenId};

impl Scheduler {
    /// Applies the tokens sampled for the plan of step `step_id`, one per sample in plan order.
    /// Fails, changing nothing, if the plan is not the last one or the count is wrong.
    pub fn update(
        &mut self,
        step_id: u64,
        sampled_token_ids: &[TokenId],
    ) -> CoreResult<StepOutput> {
        let rec = match self.last.take() {
            Some(rec) if rec.step_id == step_id => rec,
            other => {
                self.last = other;
                return Err(CoreError::StalePlan {
                    got: step_id,
                    expected: self.last.as_ref().map_or(self.step + 1, |r| r.step_id),
                });
            }
        };
        if sampled_token_ids.len() != rec.total_samples {
            let expected = rec.total_samples;
            self.last = Some(rec);
            return Err(CoreError::invalid(
                "sampled_token_ids",
                "wrong_length",
                format!(
                    "`sampled_token_ids` must have one token per sample of the plan ({expected}); got {}",
                    sampled_token_ids.len()
                ),
            ));
        }
        let mut out = StepOutput::default();
        let mut next = 0;
        for (row, &num_samples) in rec.rows.iter().zip(&rec.num_samples) {
            self.advance(row.key, row.num_tokens);
            let samples = &sampled_token_ids[next..next + num_samples as usize];
            next += num_samples as usize;
            if samples.is_empty() {
                continue;
            }
            let mut keys = vec![row.key];
            if samples.len() > 1 {
                self.fork(row.key, samples.len(), &mut keys);
            }
            for (&key, &token) in keys.iter().zip(samples) {
                self.append(key, token, &mut out);
            }
        }
        out.finished_req_ids = self.drop_finished().into_iter().map(|id| id.0).collect();
        Ok(out)
    }

    /// Records that `num_tokens` more tokens of `key` are computed and caches full blocks.
    fn advance(&mut self, key: SeqKey, num_tokens: usize) {
        let s = self.seqs[key as usize]
            .as_mut()
            .expect("scheduled sequence is live");
        s.num_computed_tokens += num_tokens;
        if self.cfg.enable_prefix_caching {
            cache_full_blocks(&mut self.pool, s, self.cfg.block_size);
        }
    }

    /// Splits a request's first sequence into `n`: the children share every block (refcounts go
    /// up) and the partial last block is copied on the first write (see `reserve_blocks`).
    fn fork(&mut self, key: SeqKey, n: usize, keys: &mut Vec<SeqKey>) {
        let parent = self.seqs[key as usize].as_mut().expect("live");
        parent.seats = 1;
        let template = parent.clone();
        for &b in &template.block_table {
            for _ in 1..n {
                self.pool.incref(b);
            }
        }
        for j in 1..n {
            let child = self.insert_seq(Sequence {
                seq_index: j as u32,
                ..template.clone()
            });
            self.running.push(child);
            self.requests
                .get_mut(&template.req_id)
                .expect("request of a live seq")
                .seqs
                .push(child);
            keys.push(child);
        }
    }

    fn append(&mut self, key: SeqKey, token: TokenId, out: &mut StepOutput) {
        let s = self.seqs[key as usize].as_mut().expect("live");
        s.tokens.push(token);
        let finish = stop_reason(s, &self.cfg.eos_token_ids, self.cfg.max_model_len);
        out.req_ids.push(s.req_id.0);
        out.seq_indices.push(s.seq_index);
        out.token_ids.push(token);
        out.finish_reasons.push(finish.map_or(0, |f| f as u8));
        if let Some(reason) = finish {
            self.finish_seq(key, reason);
        }
    }
}

/// Offers `s`'s computed full blocks past `num_cached_blocks` to the prefix cache.
fn cache_full_blocks(pool: &mut crate::kv::BlockPool, s: &mut Sequence, bs: usize) {
    let num_full = s.num_computed_tokens / bs;
    while s.num_cached_blocks < num_full {
        let i = s.num_cached_blocks;
        let hash = s.block_hash(i, bs);
        let key = pool.key_after(
            i.checked_sub(1).map(|p| s.block_table[p]),
            s.extra_key.as_ref(),
        );
        let tokens = &s.tokens[i * bs..(i + 1) * bs];
        pool.insert(s.block_table[i], hash, tokens, key);
        s.num_cached_blocks += 1;
    }
}

/// The token-level stop of a sequence whose last token was just appended, if any. EOS (unless
/// `ignore_eos`) and stop token ids count only once `min_tokens` tokens exist.
fn stop_reason(s: &Sequence, eos: &[TokenId], max_model_len: usize) -> Option<FinishReason> {
    let token = *s.tokens.last().expect("just appended");
    let params = &s.params;
    let num_output = s.num_output_tokens();
    if num_output >= params.min_tokens as usize
        && ((!params.ignore_eos && eos.contains(&token)) || params.stop_token_ids.contains(&token))
    {
        return Some(FinishReason::Stop);
    }
    if params.max_tokens.is_some_and(|m| num_output >= m as usize)
        || s.tokens.len() >= max_model_len
    {
        return Some(FinishReason::Length);
    }
    debug_assert_eq!(s.status, SeqStatus::Running);
    None
}
