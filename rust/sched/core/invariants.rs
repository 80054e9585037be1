//! A full consistency check of the scheduler's state, for tests and debugging (`O(blocks +
//! tokens)`, never on the hot path).

use super::Scheduler;
use crate::sched::rank::SeqKey;
use crate::types::{BlockId, SeqStatus};

impl Scheduler {
    /// Checks that every block's refcount equals the number of block tables holding it, that the
    /// free list holds exactly the unreferenced blocks, that every live sequence is in exactly
    /// one queue with a matching status, that seats stay within `max_num_seqs`, and that every
    /// cached block a sequence uses holds that sequence's tokens. Returns the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let pool = &self.pool;
        let bs = self.cfg.block_size;
        let mut refs = vec![0u32; pool.num_blocks()];
        refs[0] = 1;
        let mut seen = vec![0u8; self.seqs.len()];
        let mut seats = 0;
        for &k in &self.running {
            seen[k as usize] += 1;
            let s = self.seqs[k as usize]
                .as_ref()
                .ok_or(format!("running slot {k} is empty"))?;
            if s.status != SeqStatus::Running {
                return Err(format!("running sequence {k} has status {:?}", s.status));
            }
            seats += s.seats;
            if s.block_table.len() * bs < s.num_computed_tokens
                || s.num_computed_tokens > s.tokens.len()
            {
                return Err(format!(
                    "sequence {k}: {} computed tokens, {} tokens, {} blocks",
                    s.num_computed_tokens,
                    s.tokens.len(),
                    s.block_table.len()
                ));
            }
            for (i, &b) in s.block_table.iter().enumerate() {
                if b == BlockId::NULL {
                    return Err(format!("sequence {k} holds the null block"));
                }
                refs[b.index()] += 1;
                let full_and_computed = (i + 1) * bs <= s.num_computed_tokens;
                if let (true, Some(cached)) = (full_and_computed, pool.cached_tokens(b)) {
                    if cached != &s.tokens[i * bs..(i + 1) * bs] {
                        return Err(format!(
                            "sequence {k} block {i} ({b:?}) is cached with other tokens"
                        ));
                    }
                }
            }
        }
        for k in self.waiting.iter() {
            seen[k as usize] += 1;
            let s = self.seqs[k as usize]
                .as_ref()
                .ok_or(format!("waiting slot {k} is empty"))?;
            if !matches!(s.status, SeqStatus::Waiting | SeqStatus::Preempted)
                || !s.block_table.is_empty()
            {
                return Err(format!(
                    "waiting sequence {k}: status {:?}, {} blocks",
                    s.status,
                    s.block_table.len()
                ));
            }
        }
        for (k, slot) in self.seqs.iter().enumerate() {
            if slot.is_some() != (seen[k] == 1) {
                return Err(format!("sequence {k} is in {} queues", seen[k]));
            }
        }
        if seats != self.num_running_seats || seats > self.cfg.max_num_seqs {
            return Err(format!(
                "{seats} seats used, {} counted, max {}",
                self.num_running_seats, self.cfg.max_num_seqs
            ));
        }
        for (b, &held) in refs.iter().enumerate() {
            let counted = pool.ref_count(BlockId(b as u32));
            if held != counted {
                return Err(format!("block {b}: refcount {counted} but {held} holders"));
            }
        }
        let free = pool.free_list();
        if free.len() != pool.num_free()
            || free.iter().any(|&b| refs[b.index()] != 0)
            || refs.iter().filter(|&&r| r == 0).count() != free.len()
        {
            return Err(format!(
                "free list has {} blocks, {} counted",
                free.len(),
                pool.num_free()
            ));
        }
        let num_live: usize = self.groups.values().map(|r| r.seqs.len()).sum();
        let all_live = self.groups.values().all(|r| {
            r.seqs
                .iter()
                .all(|&k: &SeqKey| self.seqs[k as usize].is_some())
        });
        if num_live != self.seqs.iter().flatten().count() || !all_live {
            return Err("requests and sequences disagree".into());
        }
        Ok(())
    }
}
