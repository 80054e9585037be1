//! Steps 1-7 without copying the row. When every processor a request asks for is sparse, the
//! processed row equals the raw row except at the ids the processors touch, which live in an
//! overlay; greedy and top-k rows then read the raw logits once, in place, instead of copying
//! them into scratch and reading them again.

use super::kernels::Scale;
use super::processors::{apply_sparse_steps, RowMut};
use super::scratch::ProcScratch;
use super::select::{rank, top_admitted, Admit, Cand};
use super::SampleRequest;
use crate::types::TokenId;

/// Marks an id without an overlay entry.
const ABSENT: u32 = u32::MAX;

/// Storage of an overlay. `slot[id]` is the index of `id`'s entry in `ids` / `vals`, or
/// [`ABSENT`]; every slot is [`ABSENT`] between uses.
#[derive(Default)]
pub(crate) struct OverlayScratch {
    slot: Vec<u32>,
    ids: Vec<TokenId>,
    vals: Vec<f32>,
}

impl OverlayScratch {
    /// Sizes the slots for `vocab`.
    pub fn fit(&mut self, vocab: usize) {
        self.clear();
        self.slot.resize(vocab, ABSENT);
    }

    /// Drops every entry. Run before use too, so a panic mid-way leaves no stale slot.
    fn clear(&mut self) {
        for &id in &self.ids {
            if let Some(slot) = self.slot.get_mut(id as usize) {
                *slot = ABSENT;
            }
        }
        self.ids.clear();
        self.vals.clear();
    }
}

/// Admits the ids without an overlay entry.
#[derive(Clone, Copy)]
struct Untouched<'a>(&'a [u32]);

impl Admit for Untouched<'_> {
    #[inline(always)]
    fn admit(self, id: usize) -> bool {
        self.0[id] == ABSENT
    }
}

/// The processed row as the raw row plus entries for the touched ids.
struct Overlay<'a> {
    raw: &'a [f32],
    o: &'a mut OverlayScratch,
}

impl RowMut for Overlay<'_> {
    fn at(&mut self, id: TokenId) -> Option<&mut f32> {
        let raw = *self.raw.get(id as usize)?;
        let slot = self.o.slot[id as usize];
        let index = if slot == ABSENT {
            let index = self.o.ids.len();
            self.o.slot[id as usize] = index as u32;
            self.o.ids.push(id);
            self.o
                .vals
                .push(if raw.is_nan() { f32::NEG_INFINITY } else { raw });
            index
        } else {
            slot as usize
        };
        Some(&mut self.o.vals[index])
    }
}

/// Runs steps 1-7 of `req` as an overlay over `raw` (the caller checked `all_sparse`) and
/// leaves in `out` the `k >= 1` best values of the processed row scaled by `sc`, in rank order:
/// exactly what a top-k scan of the processed copy would give. The scan of the raw row skips the
/// touched ids, whose processed values then compete with the `k` best untouched ones.
pub(crate) fn top_of_processed<S: Scale>(
    raw: &[f32],
    req: &SampleRequest<'_>,
    sc: S,
    k: usize,
    o: &mut OverlayScratch,
    ps: &mut ProcScratch,
    out: &mut Vec<Cand>,
) {
    o.clear();
    apply_sparse_steps(&mut Overlay { raw, o: &mut *o }, req, ps);
    top_admitted(raw, sc, k, Untouched(&o.slot), out);
    for (&id, &v) in o.ids.iter().zip(&o.vals) {
        let w = sc.apply(v);
        // NaN (from +inf plus a -inf bias) never qualifies, as in the scan of a dense row.
        if w > f32::NEG_INFINITY {
            out.push(Cand { w, id });
        }
    }
    if out.len() > k {
        out.select_nth_unstable_by(k - 1, rank);
        out.truncate(k);
    }
    out.sort_unstable_by(rank);
    o.clear();
}
