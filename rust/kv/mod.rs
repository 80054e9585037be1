//! Paged KV-cache bookkeeping: the block pool (refcounts, LRU free list, null block 0) and the
//! prefix cache over full blocks, keyed by chained block hashes and confirmed token by token.

mod hash;
mod pool;

pub use hash::{block_hash, root_hash, with_extra};
pub use pool::{BlockPool, CacheKey, CacheStats};
