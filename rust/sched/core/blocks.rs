//! KV blocks of sequences: reserving them for a row (copy-on-write of a shared partial block),
//! admitting a sequence over its cached prefix, recording computed tokens and offering full
//! blocks to the prefix cache, releasing blocks past what is computed.

use super::Scheduler;
use crate::kv::BlockPool;
use crate::sched::media::num_spans_done;
use crate::sched::rank::SeqKey;
use crate::sched::seq::Sequence;
use crate::types::{BlockId, SeqStatus};

impl Scheduler {
    /// Reserves the blocks `key` needs to compute `num_tokens` more tokens, copying a shared
    /// partial block first (copy-on-write). Returns None, changing nothing, if too few are free;
    /// else the copy made, if any.
    pub(crate) fn reserve_blocks(
        &mut self,
        key: SeqKey,
        num_tokens: usize,
    ) -> Option<Option<(BlockId, BlockId)>> {
        let bs = self.cfg.block_size;
        let s = self.seqs[key as usize].as_mut().expect("live");
        let end = s.num_computed_tokens + num_tokens;
        let num_new = end.div_ceil(bs).saturating_sub(s.block_table.len());
        let write_block = s.num_computed_tokens / bs;
        let shared = s
            .block_table
            .get(write_block)
            .is_some_and(|&b| self.pool.ref_count(b) > 1);
        if self.pool.num_free() < num_new + usize::from(shared) {
            return None;
        }
        let mut copy = None;
        if shared {
            let src = s.block_table[write_block];
            let mut dst = Vec::with_capacity(1);
            self.pool.allocate_into(1, &mut dst);
            self.pool.free(&[src]);
            s.block_table[write_block] = dst[0];
            copy = Some((src, dst[0]));
        }
        self.pool.allocate_into(num_new, &mut s.block_table);
        Some(copy)
    }

    /// Blocks that admitting `key` with prefix `hits` takes from the free list, computing at
    /// most `budget` tokens now (`usize::MAX`: everything up to its compute target).
    pub(super) fn blocks_to_admit(&self, key: SeqKey, hits: &[BlockId], budget: usize) -> usize {
        let s = self.seq(key);
        let num_cached = (hits.len() * self.cfg.block_size).min(s.compute_target());
        let end = num_cached + (s.compute_target() - num_cached).min(budget);
        let revived = hits
            .iter()
            .filter(|&&b| self.pool.ref_count(b) == 0)
            .count();
        end.div_ceil(self.cfg.block_size) - hits.len() + revived
    }

    /// Admits `key` with prefix `hits`: the row's token count this step (at most `budget`;
    /// 0 = no row). `whole` reserves the blocks for everything up to its compute target.
    pub(super) fn admit(
        &mut self,
        key: SeqKey,
        hits: &[BlockId],
        budget: usize,
        whole: bool,
    ) -> usize {
        let bs = self.cfg.block_size;
        for &b in hits {
            self.pool.incref(b);
        }
        let s = self.seqs[key as usize].as_mut().expect("live");
        self.waiting.pop(key, s.priority);
        s.block_table.clear();
        s.block_table.extend_from_slice(hits);
        s.num_computed_tokens = hits.len() * bs;
        s.num_cached_blocks = hits.len();
        s.num_encoded_spans = num_spans_done(&s.media, s.num_computed_tokens);
        let target = s.compute_target();
        let num_tokens = (target - s.num_computed_tokens).min(budget);
        let end = match whole {
            true => target,
            false => s.num_computed_tokens + num_tokens,
        };
        let ok = self.pool.allocate_into(
            end.div_ceil(bs).saturating_sub(hits.len()),
            &mut s.block_table,
        );
        debug_assert!(ok, "blocks were counted before admitting");
        s.status = SeqStatus::Running;
        self.num_running_seats += s.seats;
        self.running.push(key);
        num_tokens
    }

    /// The longest confirmed run of cached blocks at the start of `key`'s tokens, leaving at
    /// least the last token to compute.
    pub(super) fn find_cached_prefix(&mut self, key: SeqKey) -> Vec<BlockId> {
        let bs = self.cfg.block_size;
        let s = self.seqs[key as usize].as_mut().expect("live");
        // Prompt logprobs are computed in prefill: a hit would skip the positions to score.
        if !self.cfg.enable_prefix_caching || s.params.prompt_logprobs.is_some() {
            return Vec::new();
        }
        let max_blocks = (s.tokens.len() - 1) / bs;
        let mut hits = Vec::new();
        for i in 0..max_blocks {
            let hash = s.block_hash(i, bs);
            let cache_key = self
                .pool
                .key_after(hits.last().copied(), s.extra_key.as_ref());
            let media = s.block_media_key(i, bs);
            let tokens = &s.tokens[i * bs..(i + 1) * bs];
            match self.pool.lookup(hash, tokens, &cache_key, media.as_deref()) {
                Some(b) => hits.push(b),
                None => break,
            }
        }
        hits
    }

    /// Records that `num_tokens` more tokens of `key` are computed and caches full blocks.
    pub(crate) fn advance(&mut self, key: SeqKey, num_tokens: usize) {
        self.seq_mut(key).num_computed_tokens += num_tokens;
        self.cache_blocks(key);
    }

    /// Offers `key`'s computed full blocks not yet offered to the prefix cache (when caching).
    pub(crate) fn cache_blocks(&mut self, key: SeqKey) {
        if self.cfg.enable_prefix_caching {
            let s = self.seqs[key as usize].as_mut().expect("live");
            cache_full_blocks(&mut self.pool, s, self.cfg.block_size);
        }
    }

    /// Frees `key`'s blocks past its computed tokens: blocks reserved this step for positions
    /// that were not kept, so never cached and never shared.
    pub(crate) fn release_blocks_past_computed(&mut self, key: SeqKey) {
        let bs = self.cfg.block_size;
        let s = self.seqs[key as usize].as_mut().expect("live");
        let keep = s.num_computed_tokens.div_ceil(bs);
        if s.block_table.len() > keep {
            let released = s.block_table.split_off(keep);
            self.pool.free(&released);
        }
    }
}

/// Offers `s`'s computed full blocks past `num_cached_blocks` to the prefix cache.
fn cache_full_blocks(pool: &mut BlockPool, s: &mut Sequence, bs: usize) {
    let num_full = s.num_computed_tokens / bs;
    while s.num_cached_blocks < num_full {
        let i = s.num_cached_blocks;
        let hash = s.block_hash(i, bs);
        let key = pool.key_after(
            i.checked_sub(1).map(|p| s.block_table[p]),
            s.extra_key.as_ref(),
        );
        let media = s.block_media_key(i, bs);
        let tokens = &s.tokens[i * bs..(i + 1) * bs];
        pool.insert(s.block_table[i], hash, tokens, key, media.as_deref());
        s.num_cached_blocks += 1;
    }
}
