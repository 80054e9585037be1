//! What the bounded fuzz tests share (test builds only): a small seeded generator, so a failing
//! case reproduces from its seed, and the number of cases, which `FERROLLM_FUZZ_CASES` raises
//! (`make fuzz`) above each test's default for plain `cargo test`.

/// xorshift64*: small, seeded, good enough to pick shapes and ids.
pub(crate) struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// One of `items` (non-empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// Cases per fuzz test: `FERROLLM_FUZZ_CASES` when set, else `default`.
pub(crate) fn cases(default: u64) -> u64 {
    std::env::var("FERROLLM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
