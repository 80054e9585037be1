//! The block pool: `num_blocks` KV blocks of `block_size` token slots each, with refcounts, an
//! LRU list of free blocks and the prefix cache.
//!
//! A block is *free* when its refcount is 0. Free blocks sit in an intrusive doubly linked list:
//! allocation takes from the front, freeing appends to the back, so the least recently freed
//! block is reused first. A free block keeps its prefix-cache entry until it is reused, and a
//! cache hit on a free block takes it back out of the list.
//!
//! The prefix cache maps a chained block hash to a block. Hashes only find candidates: a hit is
//! confirmed by comparing the block's tokens and its parent link (the parent block id plus that
//! block's generation, bumped each time a block is reused) or, for a first block, its extra key,
//! and the bytes naming the media the block overlaps (its positions' embeddings are not its
//! tokens').
//! By induction from the root, a confirmed chain of hits holds exactly the caller's prefix, so a
//! hash collision can never hand out wrong KV.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::types::{BlockId, TokenId};

const NIL: u32 = u32::MAX;

/// What a cached block was computed from, besides its own tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheKey {
    /// The first block of a sequence, with the sequence's extra key.
    Root(Option<Arc<str>>),
    /// A later block: the block holding the previous positions and its generation at the time.
    Child {
        parent: BlockId,
        parent_generation: u32,
    },
}

#[derive(Debug, Clone)]
struct CacheEntry {
    hash: u64,
    key: CacheKey,
    /// The media spans the block overlaps (see `sched::media::media_key`); None for text.
    media: Option<Box<[u8]>>,
}

/// Prefix-cache counters since the pool was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Blocks looked up in the cache.
    pub num_queried_blocks: u64,
    /// Lookups that found a confirmed block.
    pub num_hit_blocks: u64,
}

/// Refcounted KV blocks with an LRU free list and a prefix cache. See the module docs.
#[derive(Debug)]
pub struct BlockPool {
    block_size: usize,
    ref_cnt: Vec<u32>,
    generation: Vec<u32>,
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    num_free: usize,
    entries: Vec<Option<CacheEntry>>,
    tokens: Vec<TokenId>,
    map: FxHashMap<u64, BlockId>,
    stats: CacheStats,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks (block 0 is the null block, so `num_blocks - 1` are usable).
    /// Panics if `num_blocks < 2`, `block_size == 0` or `num_blocks` does not fit in a `u32`;
    /// the scheduler's config validation rules these out first.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        assert!(num_blocks >= 2 && num_blocks < NIL as usize && block_size > 0);
        let mut pool = BlockPool {
            block_size,
            ref_cnt: vec![0; num_blocks],
            generation: vec![0; num_blocks],
            prev: vec![NIL; num_blocks],
            next: vec![NIL; num_blocks],
            head: NIL,
            tail: NIL,
            num_free: 0,
            entries: vec![None; num_blocks],
            tokens: vec![0; num_blocks * block_size],
            map: FxHashMap::default(),
            stats: CacheStats::default(),
        };
        // The null block is never free: it carries a permanent reference.
        pool.ref_cnt[0] = 1;
        for b in 1..num_blocks as u32 {
            pool.push_back(b);
        }
        pool
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// All blocks, the null block included.
    pub fn num_blocks(&self) -> usize {
        self.ref_cnt.len()
    }

    /// Blocks with refcount 0 (cached or not): what `allocate` can hand out.
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Blocks currently holding a prefix-cache entry.
    pub fn num_cached(&self) -> usize {
        self.map.len()
    }

    /// The refcount of `block` (the null block reports 1).
    pub fn ref_count(&self, block: BlockId) -> u32 {
        self.ref_cnt[block.index()]
    }

    /// How many times `block` has been reused since the pool was built.
    pub fn generation(&self, block: BlockId) -> u32 {
        self.generation[block.index()]
    }

    /// Prefix-cache counters.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Takes `count` free blocks (refcount becomes 1), least recently freed first, dropping any
    /// cache entries they held. Returns false, and takes nothing, if fewer are free.
    pub fn allocate_into(&mut self, count: usize, out: &mut Vec<BlockId>) -> bool {
        if count > self.num_free {
            return false;
        }
        out.reserve(count);
        for _ in 0..count {
            let b = self.head;
            self.unlink(b);
            self.evict(b);
            self.generation[b as usize] = self.generation[b as usize].wrapping_add(1);
            self.ref_cnt[b as usize] = 1;
            out.push(BlockId(b));
        }
        true
    }

    /// Adds a reference to a block already in use, or revives a free one (a cache hit).
    pub fn incref(&mut self, block: BlockId) {
        let b = block.0;
        debug_assert_ne!(block, BlockId::NULL);
        if self.ref_cnt[b as usize] == 0 {
            self.unlink(b);
        }
        self.ref_cnt[b as usize] += 1;
    }

    /// Drops one reference from each block, last block first, so that a sequence's tail blocks
    /// (the least shared) are the first to be reused.
    pub fn free(&mut self, blocks: &[BlockId]) {
        for &block in blocks.iter().rev() {
            let b = block.0;
            debug_assert!(self.ref_cnt[b as usize] > 0 && block != BlockId::NULL);
            self.ref_cnt[b as usize] -= 1;
            if self.ref_cnt[b as usize] == 0 {
                self.push_back(b);
            }
        }
    }

    /// The cache key of a block that follows `parent` (None: the first block, with `extra_key`).
    pub fn key_after(&self, parent: Option<BlockId>, extra_key: Option<&Arc<str>>) -> CacheKey {
        match parent {
            None => CacheKey::Root(extra_key.cloned()),
            Some(parent) => CacheKey::Child {
                parent,
                parent_generation: self.generation(parent),
            },
        }
    }

    /// Finds the cached block whose hash is `hash`, whose tokens are `tokens`, whose parent is
    /// `key` and whose media are `media`. Only a confirmed match is returned; the caller then
    /// takes it with `incref`.
    pub fn lookup(
        &mut self,
        hash: u64,
        tokens: &[TokenId],
        key: &CacheKey,
        media: Option<&[u8]>,
    ) -> Option<BlockId> {
        self.stats.num_queried_blocks += 1;
        let block = *self.map.get(&hash)?;
        let entry = self.entries[block.index()].as_ref()?;
        let start = block.index() * self.block_size;
        let confirmed = entry.hash == hash
            && &entry.key == key
            && entry.media.as_deref() == media
            && self.tokens[start..start + self.block_size] == *tokens;
        if confirmed {
            self.stats.num_hit_blocks += 1;
            Some(block)
        } else {
            None
        }
    }

    /// Records that `block` (in use, full) holds `tokens` (with `media`) after the prefix `key`,
    /// under `hash`. Returns false if the hash already names another block (that one stays) or
    /// the block is already cached.
    pub fn insert(
        &mut self,
        block: BlockId,
        hash: u64,
        tokens: &[TokenId],
        key: CacheKey,
        media: Option<&[u8]>,
    ) -> bool {
        debug_assert_eq!(tokens.len(), self.block_size);
        debug_assert!(self.ref_cnt[block.index()] > 0 && block != BlockId::NULL);
        if self.entries[block.index()].is_some() || self.map.contains_key(&hash) {
            return false;
        }
        let start = block.index() * self.block_size;
        self.tokens[start..start + self.block_size].copy_from_slice(tokens);
        self.entries[block.index()] = Some(CacheEntry {
            hash,
            key,
            media: media.map(Box::from),
        });
        self.map.insert(hash, block);
        true
    }

    /// Whether `block` holds a prefix-cache entry.
    pub fn is_cached(&self, block: BlockId) -> bool {
        self.entries[block.index()].is_some()
    }

    /// The tokens recorded for a cached block.
    pub fn cached_tokens(&self, block: BlockId) -> Option<&[TokenId]> {
        self.entries[block.index()].as_ref()?;
        let start = block.index() * self.block_size;
        Some(&self.tokens[start..start + self.block_size])
    }

    /// Drops every cache entry (blocks in use keep their contents, they just stop being shared).
    pub fn reset_prefix_cache(&mut self) {
        for entry in &mut self.entries {
            *entry = None;
        }
        self.map.clear();
    }

    /// The free list front to back (for tests and invariant checks).
    pub fn free_list(&self) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(self.num_free);
        let mut b = self.head;
        while b != NIL {
            out.push(BlockId(b));
            b = self.next[b as usize];
        }
        out
    }

    fn evict(&mut self, b: u32) {
        if let Some(entry) = self.entries[b as usize].take() {
            if self.map.get(&entry.hash) == Some(&BlockId(b)) {
                self.map.remove(&entry.hash);
            }
        }
    }

    fn push_back(&mut self, b: u32) {
        self.prev[b as usize] = self.tail;
        self.next[b as usize] = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.next[self.tail as usize] = b;
        }
        self.tail = b;
        self.num_free += 1;
    }

    fn unlink(&mut self, b: u32) {
        let (p, n) = (self.prev[b as usize], self.next[b as usize]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[b as usize] = NIL;
        self.next[b as usize] = NIL;
        self.num_free -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{block_hash, root_hash};

    fn root() -> CacheKey {
        CacheKey::Root(None)
    }

    #[test]
    fn null_block_is_never_handed_out() {
        let mut pool = BlockPool::new(4, 2);
        let mut got = Vec::new();
        assert!(pool.allocate_into(3, &mut got));
        assert_eq!(got, vec![BlockId(1), BlockId(2), BlockId(3)]);
        assert!(!pool.allocate_into(1, &mut got));
        assert_eq!(pool.num_free(), 0);
    }

    #[test]
    fn allocation_is_all_or_nothing() {
        let mut pool = BlockPool::new(4, 2);
        let mut got = Vec::new();
        assert!(!pool.allocate_into(4, &mut got));
        assert!(got.is_empty());
        assert_eq!(pool.num_free(), 3);
    }

    #[test]
    fn freed_blocks_are_reused_least_recently_freed_first_tail_first() {
        let mut pool = BlockPool::new(6, 2);
        let mut a = Vec::new();
        assert!(pool.allocate_into(2, &mut a)); // 1, 2
        let mut b = Vec::new();
        assert!(pool.allocate_into(2, &mut b)); // 3, 4
        pool.free(&a); // frees 2 then 1
        pool.free(&b); // frees 4 then 3
        assert_eq!(
            pool.free_list(),
            vec![BlockId(5), BlockId(2), BlockId(1), BlockId(4), BlockId(3)]
        );
    }

    #[test]
    fn cached_free_block_survives_until_reused_and_hit_revives_it() {
        let mut pool = BlockPool::new(3, 2);
        let mut got = Vec::new();
        assert!(pool.allocate_into(1, &mut got));
        let h = block_hash(root_hash(None), &[7, 8]);
        assert!(pool.insert(got[0], h, &[7, 8], root(), None));
        pool.free(&got);
        assert_eq!(pool.num_free(), 2);
        let hit = pool
            .lookup(h, &[7, 8], &root(), None)
            .expect("cached block found after free");
        pool.incref(hit);
        assert_eq!(pool.num_free(), 1);
        assert_eq!(pool.ref_count(hit), 1);
        pool.free(&[hit]);
        // Reusing every free block evicts the entry.
        let mut more = Vec::new();
        assert!(pool.allocate_into(2, &mut more));
        assert!(pool.lookup(h, &[7, 8], &root(), None).is_none());
        assert_eq!(pool.num_cached(), 0);
    }

    #[test]
    fn colliding_hash_is_rejected_by_token_and_parent_comparison() {
        let mut pool = BlockPool::new(4, 2);
        let mut got = Vec::new();
        assert!(pool.allocate_into(2, &mut got));
        // Pretend two different blocks hash to 42.
        assert!(pool.insert(got[0], 42, &[1, 2], root(), None));
        assert!(pool.lookup(42, &[1, 3], &root(), None).is_none());
        assert!(pool
            .lookup(42, &[1, 2], &CacheKey::Root(Some("salt".into())), None)
            .is_none());
        let child = CacheKey::Child {
            parent: got[0],
            parent_generation: pool.generation(got[0]),
        };
        assert!(pool.insert(got[1], 43, &[5, 6], child.clone(), None));
        assert_eq!(pool.lookup(43, &[5, 6], &child, None), Some(got[1]));
        let stale = CacheKey::Child {
            parent: got[0],
            parent_generation: pool.generation(got[0]) + 1,
        };
        assert!(pool.lookup(43, &[5, 6], &stale, None).is_none());
        // Same tokens and parent, other media (an image's placeholder tokens are all alike).
        assert!(pool.lookup(43, &[5, 6], &child, Some(b"image")).is_none());
        // A second block under an existing hash is not cached.
        assert!(!pool.insert(got[1], 42, &[1, 2], root(), None));
        let stats = pool.stats();
        assert_eq!((stats.num_queried_blocks, stats.num_hit_blocks), (5, 1));
    }
}
