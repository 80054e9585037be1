//! Per-thread buffers, kept across calls so that a step allocates nothing once warm: each rayon
//! worker copies its row into `row`, and the penalty counts are a dense array that is zero
//! between uses (only the touched entries are reset).

use std::cell::RefCell;

use super::overlay::OverlayScratch;
use super::select::{Cand, NUM_BUCKETS};

/// Buffers of the logits processors.
#[derive(Default)]
pub(crate) struct ProcScratch {
    /// Per-token counts: output occurrences, plus [`IN_PROMPT`] when the prompt holds it.
    /// All zero between uses.
    pub counts: Vec<u32>,
    /// Tokens whose `counts` entry is nonzero.
    pub touched: Vec<u32>,
    /// Values of the allowed tokens while the rest of the row is banned.
    pub saved: Vec<f32>,
    /// Prompt ++ output, for the n-gram scan.
    pub seq: Vec<u32>,
}

/// Marks a token seen in the prompt in [`ProcScratch::counts`].
pub(crate) const IN_PROMPT: u32 = 1 << 31;

/// Everything one worker needs for one row.
#[derive(Default)]
pub(crate) struct Scratch {
    /// The processed logits of the row being sampled.
    pub row: Vec<f32>,
    /// Dense weights `exp(x - max)` when a filter needs the whole distribution.
    pub e: Vec<f32>,
    /// The kept tokens of the filtered distribution.
    pub cands: Vec<Cand>,
    /// A second candidate list (the head of a dense draw, top logprobs).
    pub head: Vec<Cand>,
    /// Bucket masses for ranking long lists; all zero between uses.
    pub hist: Vec<f64>,
    pub proc: ProcScratch,
    /// The processed row as an overlay over the raw one (sparse processors only).
    pub overlay: OverlayScratch,
}

impl Scratch {
    /// Sizes the buffers for `vocab`; the zero invariants of `counts` and `hist` hold after.
    pub fn fit(&mut self, vocab: usize) {
        self.row.resize(vocab, 0.0);
        self.e.resize(vocab, 0.0);
        self.proc.counts.resize(vocab, 0);
        self.hist.resize(NUM_BUCKETS, 0.0);
        self.overlay.fit(vocab);
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs `f` with this thread's scratch sized for `vocab`.
pub(crate) fn with_scratch<R>(vocab: usize, f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|cell| {
        let mut s = cell.borrow_mut();
        s.fit(vocab);
        f(&mut s)
    })
}
