//! Chained block hashes: a full block's hash covers its parent's hash and its own tokens, so
//! equal hashes mean (barring collisions, which the pool rules out by comparing tokens) equal
//! prefixes. Extra keys such as an adapter id or a cache salt seed the chain at its root; a
//! block's own extra bytes (the media spans it overlaps) are mixed into its parent's hash.

use crate::types::TokenId;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Seed of every chain that has no extra key.
const ROOT_SEED: u64 = 0x6665_7272_6f6c_6c6d; // "ferrollm"

/// The parent hash of a sequence's first block, derived from its extra key (if any).
pub fn root_hash(extra_key: Option<&str>) -> u64 {
    match extra_key {
        None => ROOT_SEED,
        Some(key) => xxh3_64(key.as_bytes()) ^ ROOT_SEED.rotate_left(17),
    }
}

/// The hash of a full block of `tokens` whose prefix hashes to `parent`.
pub fn block_hash(parent: u64, tokens: &[TokenId]) -> u64 {
    // SAFETY: a `u32` slice is also a valid, initialized byte slice of 4x the length; `u8` has
    // alignment 1, and the lifetime is tied to `tokens`. The hash is only used in-process, so
    // byte order does not matter.
    let bytes = unsafe {
        std::slice::from_raw_parts(tokens.as_ptr().cast::<u8>(), std::mem::size_of_val(tokens))
    };
    xxh3_64_with_seed(bytes, parent)
}

/// The parent hash of a block that carries `extra` bytes of its own (e.g. the media spans it
/// overlaps): `block_hash(with_extra(parent, extra), tokens)` differs from the plain block's
/// hash and from the same tokens with other bytes.
pub fn with_extra(parent: u64, extra: &[u8]) -> u64 {
    xxh3_64_with_seed(extra, parent.rotate_left(29) ^ ROOT_SEED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_depends_on_parent_tokens_and_extra_key() {
        let root = root_hash(None);
        assert_ne!(root, root_hash(Some("adapter:1")));
        assert_ne!(root_hash(Some("a")), root_hash(Some("b")));
        let h = block_hash(root, &[1, 2, 3, 4]);
        assert_eq!(h, block_hash(root, &[1, 2, 3, 4]));
        assert_ne!(h, block_hash(root, &[1, 2, 3, 5]));
        assert_ne!(h, block_hash(root ^ 1, &[1, 2, 3, 4]));
        let a = block_hash(with_extra(root, b"image a"), &[1, 2, 3, 4]);
        assert_ne!(a, h);
        assert_ne!(a, block_hash(with_extra(root, b"image b"), &[1, 2, 3, 4]));
        assert_eq!(a, block_hash(with_extra(root, b"image a"), &[1, 2, 3, 4]));
    }
}
