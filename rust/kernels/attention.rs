//! Paged attention reading the KV cache where it lies: each query walks its row's block table
//! (no gather into a padded batch), the query heads sharing a KV head are computed together so
//! every K/V row is read once per query token, and the softmax is online with float32
//! accumulation. K/V cache and q/out are float32 or bfloat16, independently.
//!
//! Cache layout per layer: `[num_blocks, block_size, num_kv_heads, head_dim]`; slot `s` is
//! block `s / block_size`, offset `s % block_size`. A query at position `p` of row `r` sees the
//! keys at positions `<= p` below `context_lens[r]` (and above `p - sliding_window`).

use super::cpu::{CpuFeatures, KernelTier};
use super::pool::{self, SendPtr};
use super::simd::{axpy, dot, exp_neg, Elem};
use crate::error::{CoreError, CoreResult};

/// Head counts and cache geometry of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    /// Query heads; a multiple of `num_kv_heads`.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Blocks in the cache (block 0 included).
    pub num_blocks: usize,
    /// Token slots per block.
    pub block_size: usize,
}

impl Dims {
    fn group(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// Elements of one cache tensor: `num_blocks * block_size * num_kv_heads * head_dim`.
    pub fn cache_len(&self) -> usize {
        self.num_blocks * self.block_size * self.num_kv_heads * self.head_dim
    }

    fn check(&self) -> CoreResult<()> {
        let ok = self.num_kv_heads > 0
            && self.num_heads.is_multiple_of(self.num_kv_heads)
            && self.head_dim > 0
            && self.block_size > 0;
        if ok {
            return Ok(());
        }
        Err(invalid(
            "dims",
            format!("`num_heads` must be a multiple of `num_kv_heads` and every size positive; got {self:?}"),
        ))
    }
}

/// Token-major rows of `[heads, head_dim]` values: token `t` starts at `data[t * stride]` and
/// its heads are adjacent (a view such as `qkv[:, :num_heads]` needs no copy).
#[derive(Clone, Copy, Debug)]
pub struct Rows<'a, T> {
    /// The values.
    pub data: &'a [T],
    /// Elements from one token to the next.
    pub stride: usize,
}

impl<T> Rows<'_, T> {
    fn check(&self, param: &str, num_tokens: usize, width: usize) -> CoreResult<()> {
        let fits = num_tokens == 0
            || (self.stride >= width && (num_tokens - 1) * self.stride + width <= self.data.len());
        if fits {
            return Ok(());
        }
        let msg = format!(
            "`{param}` must hold {num_tokens} rows of {width} values {} apart; got {} values",
            self.stride,
            self.data.len()
        );
        Err(invalid(param, msg))
    }
}

/// One step's paged layout (the scheduler's `StepPlan` columns) and which rows to attend.
#[derive(Clone, Copy, Debug)]
pub struct StepLayout<'a> {
    /// Position of each token in its sequence.
    pub positions: &'a [i64],
    /// Cache slot each token's K/V is written to.
    pub slot_mapping: &'a [i64],
    /// Row `r`'s tokens are `cu_seqlens_q[r]..cu_seqlens_q[r + 1]`.
    pub cu_seqlens_q: &'a [i32],
    /// Keys each row attends over (its cached and new tokens).
    pub context_lens: &'a [i32],
    /// `[rows, max_blocks]`, row-major: the blocks of each row's context, in order.
    pub block_tables: &'a [i32],
    /// Columns of `block_tables`.
    pub max_blocks: usize,
    /// The rows whose queries this call attends; the output of other rows is left as it was.
    pub rows: &'a [i32],
    /// Keys more than this many positions back are not seen (None: all are).
    pub sliding_window: Option<usize>,
}

const SKIP: u32 = u32::MAX;

impl StepLayout<'_> {
    fn num_rows(&self) -> usize {
        self.context_lens.len()
    }

    /// Checks every index the kernel will follow, so no plan can make it read out of bounds;
    /// returns each token's row (`SKIP` for rows not in `rows`).
    fn check(&self, dims: &Dims) -> CoreResult<Vec<u32>> {
        let num_tokens = self.positions.len();
        let num_rows = self.num_rows();
        let cu = self.cu_seqlens_q;
        if self.slot_mapping.len() != num_tokens {
            return Err(mismatch(
                "slot_mapping",
                self.slot_mapping.len(),
                num_tokens,
            ));
        }
        if cu.len() != num_rows + 1 {
            return Err(mismatch("cu_seqlens_q", cu.len(), num_rows + 1));
        }
        if self.block_tables.len() != num_rows * self.max_blocks {
            return Err(mismatch(
                "block_tables",
                self.block_tables.len(),
                num_rows * self.max_blocks,
            ));
        }
        let ordered = cu[0] == 0 && cu.windows(2).all(|w| w[0] <= w[1]);
        if !ordered || cu[num_rows] as usize != num_tokens {
            let msg = format!("`cu_seqlens_q` must rise from 0 to {num_tokens} (the token count)");
            return Err(invalid("cu_seqlens_q", msg));
        }
        let num_slots = (dims.num_blocks * dims.block_size) as i64;
        if let Some(s) = self
            .slot_mapping
            .iter()
            .find(|&&s| !(0..num_slots).contains(&s))
        {
            let msg = format!("`slot_mapping` entries must be in [0, {num_slots}); got {s}");
            return Err(invalid("slot_mapping", msg));
        }
        let mut token_row = vec![SKIP; num_tokens];
        for &r in self.rows {
            let r = usize::try_from(r)
                .ok()
                .filter(|&r| r < num_rows)
                .ok_or_else(|| {
                    invalid(
                        "rows",
                        format!("`rows` entries must be in [0, {num_rows}); got {r}"),
                    )
                })?;
            self.check_row(r, dims)?;
            token_row[cu[r] as usize..cu[r + 1] as usize].fill(r as u32);
        }
        Ok(token_row)
    }

    fn check_row(&self, r: usize, dims: &Dims) -> CoreResult<()> {
        let ctx = self.context_lens[r];
        let cap = self.max_blocks * dims.block_size;
        if ctx < 0 || ctx as usize > cap {
            let msg = format!("`context_lens` entries must be in [0, {cap}]; row {r} has {ctx}");
            return Err(invalid("context_lens", msg));
        }
        let used = (ctx as usize).div_ceil(dims.block_size);
        let table = &self.block_tables[r * self.max_blocks..][..used];
        if let Some(b) = table
            .iter()
            .find(|&&b| b < 0 || b as usize >= dims.num_blocks)
        {
            let msg = format!(
                "`block_tables` entries must be in [0, {}); got {b}",
                dims.num_blocks
            );
            return Err(invalid("block_tables", msg));
        }
        let tokens = self.cu_seqlens_q[r] as usize..self.cu_seqlens_q[r + 1] as usize;
        if let Some(p) = self.positions[tokens]
            .iter()
            .find(|&&p| p < 0 || p >= i64::from(ctx))
        {
            let msg =
                format!("`positions` of row {r} must be in [0, {ctx}) (its context); got {p}");
            return Err(invalid("positions", msg));
        }
        Ok(())
    }
}

fn invalid(param: &str, message: String) -> CoreError {
    CoreError::invalid(param, "invalid_attention_input", message)
}

fn mismatch(param: &str, got: usize, want: usize) -> CoreError {
    invalid(
        param,
        format!("`{param}` must have {want} entries; got {got}"),
    )
}

/// Writes token `t`'s K and V (`[num_kv_heads, head_dim]` rows, converted to the cache type) at
/// cache slot `slot_mapping[t]`.
pub fn write_kv<Q: Elem, C: Elem>(
    k: Rows<'_, Q>,
    v: Rows<'_, Q>,
    slot_mapping: &[i64],
    dims: &Dims,
    k_cache: &mut [C],
    v_cache: &mut [C],
) -> CoreResult<()> {
    dims.check()?;
    let width = dims.num_kv_heads * dims.head_dim;
    let num_slots = (dims.num_blocks * dims.block_size) as i64;
    k.check("k", slot_mapping.len(), width)?;
    v.check("v", slot_mapping.len(), width)?;
    if k_cache.len() < dims.cache_len() || v_cache.len() < dims.cache_len() {
        return Err(invalid(
            "k_cache",
            format!("the caches must hold {} values", dims.cache_len()),
        ));
    }
    for (t, &slot) in slot_mapping.iter().enumerate() {
        if !(0..num_slots).contains(&slot) {
            let msg = format!("`slot_mapping` entries must be in [0, {num_slots}); got {slot}");
            return Err(invalid("slot_mapping", msg));
        }
        let dst = slot as usize * width..(slot as usize + 1) * width;
        for (rows, cache) in [(&k, &mut *k_cache), (&v, &mut *v_cache)] {
            let src = &rows.data[t * rows.stride..][..width];
            for (d, s) in cache[dst.clone()].iter_mut().zip(src) {
                *d = C::from_f32(s.to_f32());
            }
        }
    }
    Ok(())
}

/// Attends the queries of `layout.rows` over their paged context, writing
/// `out[t, h, :]` (contiguous `[num_tokens, num_heads, head_dim]`) for each of their tokens.
/// `threads` > 1 spreads the work over `pool::run_jobs` (torch's OpenMP team when it was
/// handed over; `pool::num_threads()` is its size): a token per job, or, with fewer tokens
/// than threads (a batch-1 decode), each token's keys cut into that many ranges of whole
/// blocks whose partial softmax sums are merged after (flash-decoding's split). With 1 the
/// calling thread does all of it.
#[allow(clippy::too_many_arguments)]
pub fn attend<Q: Elem, C: Elem>(
    q: Rows<'_, Q>,
    k_cache: &[C],
    v_cache: &[C],
    layout: &StepLayout<'_>,
    dims: &Dims,
    scale: f32,
    out: &mut [Q],
    threads: usize,
) -> CoreResult<()> {
    dims.check()?;
    let num_tokens = layout.positions.len();
    let width = dims.num_heads * dims.head_dim;
    q.check("q", num_tokens, width)?;
    if out.len() != num_tokens * width {
        return Err(mismatch("out", out.len(), num_tokens * width));
    }
    if k_cache.len() < dims.cache_len() || v_cache.len() < dims.cache_len() {
        return Err(invalid(
            "k_cache",
            format!("the caches must hold {} values", dims.cache_len()),
        ));
    }
    if layout.sliding_window == Some(0) {
        return Err(invalid(
            "sliding_window",
            "`sliding_window` must be >= 1".to_string(),
        ));
    }
    let token_row = layout.check(dims)?;
    let job = Job {
        q,
        k_cache,
        v_cache,
        layout,
        dims: *dims,
        scale,
        token_row,
    };
    let item = select::<Q, C>();
    if num_tokens == 0 {
        return Ok(());
    }
    if threads <= num_tokens {
        let out_ptr = SendPtr(out.as_mut_ptr());
        let one = |t: usize| {
            // SAFETY: token `t`'s `width` outputs, disjoint from every other job's.
            let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(t * width), width) };
            // SAFETY: `select` returns a variant whose target features this CPU has.
            unsafe { item(&job, t, Span::Whole(o)) };
        };
        if threads == 1 {
            (0..num_tokens).for_each(one);
        } else {
            pool::run_jobs(num_tokens, &one);
        }
        return Ok(());
    }
    let parts = threads.div_ceil(num_tokens);
    let part_len = dims.num_heads * (dims.head_dim + 2);
    let mut partials = vec![0f32; num_tokens * parts * part_len];
    let ptr = SendPtr(partials.as_mut_ptr());
    pool::run_jobs(num_tokens * parts, &|j| {
        // SAFETY: job `j`'s own `part_len` values of `partials`.
        let p = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(j * part_len), part_len) };
        // SAFETY: as above.
        unsafe { item(&job, j / parts, Span::Part(j % parts, parts, p)) };
    });
    for (t, o) in out.chunks_exact_mut(width).enumerate() {
        if job.token_row[t] != SKIP {
            merge(
                &partials[t * parts * part_len..][..parts * part_len],
                &job.dims,
                o,
            );
        }
    }
    Ok(())
}

/// What an item computes for its token: the whole output, or part `p` of `parts` of its keys
/// as `[m (heads), l (heads), acc (heads x head_dim)]` (running max, sum and unnormalized
/// output), which `merge` combines.
enum Span<'a, Q> {
    Whole(&'a mut [Q]),
    Part(usize, usize, &'a mut [f32]),
}

/// One token's output from its parts' partial softmax sums, each rescaled to the overall max.
fn merge<Q: Elem>(partials: &[f32], d: &Dims, out: &mut [Q]) {
    let (heads, hd) = (d.num_heads, d.head_dim);
    let parts: Vec<&[f32]> = partials.chunks_exact(heads * (hd + 2)).collect();
    let mut acc = vec![0f32; hd];
    for g in 0..heads {
        let top = parts.iter().fold(f32::NEG_INFINITY, |a, p| a.max(p[g]));
        acc.fill(0.0);
        let mut l = 0f32;
        if top > f32::NEG_INFINITY {
            for p in &parts {
                let w = (p[g] - top).exp();
                l += p[heads + g] * w;
                for (a, x) in acc.iter_mut().zip(&p[2 * heads + g * hd..][..hd]) {
                    *a += x * w;
                }
            }
        }
        store_head(&acc, l, &mut out[g * hd..][..hd]);
    }
}

/// One head's output: its accumulated values over the softmax sum `l` (zeros for no keys).
fn store_head<Q: Elem>(acc: &[f32], l: f32, out: &mut [Q]) {
    let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
    for (o, a) in out.iter_mut().zip(acc) {
        *o = Q::from_f32(a * inv);
    }
}

struct Job<'a, Q, C> {
    q: Rows<'a, Q>,
    k_cache: &'a [C],
    v_cache: &'a [C],
    layout: &'a StepLayout<'a>,
    dims: Dims,
    scale: f32,
    token_row: Vec<u32>,
}

/// Computes one token's `Span`.
type ItemFn<Q, C> = unsafe fn(&Job<'_, Q, C>, usize, Span<'_, Q>);

/// The widest variant this CPU runs (the wheel targets baseline x86_64, so wider SIMD is
/// detected at run time, under the process's `FERROLLM_CPU_ISA` cap).
fn select<Q: Elem, C: Elem>() -> ItemFn<Q, C> {
    variant(CpuFeatures::get().tier)
}

/// The variant compiled for `tier`; the caller vouches that the CPU runs that tier.
fn variant<Q: Elem, C: Elem>(tier: KernelTier) -> ItemFn<Q, C> {
    #[cfg(target_arch = "x86_64")]
    match tier {
        KernelTier::Avx512 => return item_avx512::<Q, C>,
        KernelTier::Avx2 => return item_avx2::<Q, C>,
        KernelTier::Generic => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = tier;
    item_generic::<Q, C>
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn item_avx512<Q: Elem, C: Elem>(job: &Job<'_, Q, C>, i: usize, out: Span<'_, Q>) {
    attend_item::<true, Q, C>(job, i, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn item_avx2<Q: Elem, C: Elem>(job: &Job<'_, Q, C>, i: usize, out: Span<'_, Q>) {
    attend_item::<true, Q, C>(job, i, out)
}

unsafe fn item_generic<Q: Elem, C: Elem>(job: &Job<'_, Q, C>, i: usize, out: Span<'_, Q>) {
    attend_item::<false, Q, C>(job, i, out)
}

/// Item `t` is token `t`, all heads: its queries walk the visible keys block by block (scores
/// of a block, one softmax rescale, then V). Every KV head is done in the same walk so each
/// block is read once, front to back, which the hardware prefetcher streams (a walk per KV head
/// read a third of every cache line run per pass and was latency-bound past the L2).
/// A `Span::Part` walks only its share of the visible keys' blocks.
#[inline(always)]
fn attend_item<const FMA: bool, Q: Elem, C: Elem>(job: &Job<'_, Q, C>, t: usize, out: Span<'_, Q>) {
    let (d, layout) = (job.dims, job.layout);
    let row = job.token_row[t];
    if row == SKIP {
        return;
    }
    let (row, heads, group, hd, bs) = (
        row as usize,
        d.num_heads,
        d.group(),
        d.head_dim,
        d.block_size,
    );
    let pos = layout.positions[t] as usize;
    let hi = (pos + 1).min(layout.context_lens[row] as usize);
    let lo = layout
        .sliding_window
        .map_or(0, |w| (pos + 1).saturating_sub(w));
    let (lo, hi) = match &out {
        Span::Part(p, parts, _) if hi > lo => {
            let (first, blocks) = (lo / bs, (hi - 1) / bs - lo / bs + 1);
            let edge = |i: usize| ((first + blocks * i / parts) * bs).clamp(lo, hi);
            (edge(*p), edge(p + 1))
        }
        _ => (lo, hi),
    };
    let table = &layout.block_tables[row * layout.max_blocks..][..layout.max_blocks];

    // One allocation: scaled queries, accumulators, a block of scores, running max and sum.
    let mut scratch = vec![0f32; heads * (2 * hd + bs + 2)];
    let (qf, rest) = scratch.split_at_mut(heads * hd);
    let (acc, rest) = rest.split_at_mut(heads * hd);
    let (s, rest) = rest.split_at_mut(heads * bs);
    let (m, l) = rest.split_at_mut(heads);
    m.fill(f32::NEG_INFINITY);
    let q = &job.q.data[t * job.q.stride..][..heads * hd];
    for (a, b) in qf.iter_mut().zip(q) {
        *a = b.to_f32() * job.scale;
    }
    let slot_width = d.num_kv_heads * hd;
    let mut j = lo;
    while j < hi {
        let b = j / bs;
        let (n, base) = (((b + 1) * bs).min(hi) - j, table[b] as usize * bs + j % bs);
        let keys = &job.k_cache[base * slot_width..][..n * slot_width];
        for (k, slot) in keys.chunks_exact(slot_width).enumerate() {
            for (h, key) in slot.chunks_exact(hd).enumerate() {
                for g in h * group..(h + 1) * group {
                    s[g * bs + k] = dot::<FMA, C>(&qf[g * hd..][..hd], key);
                }
            }
        }
        for g in 0..heads {
            let sg = &mut s[g * bs..][..n];
            let m_new = sg.iter().fold(m[g], |a, &x| a.max(x));
            if m_new > m[g] {
                let alpha = exp_neg::<FMA>(m[g] - m_new);
                l[g] *= alpha;
                acc[g * hd..][..hd].iter_mut().for_each(|a| *a *= alpha);
                m[g] = m_new;
            }
            let mut sum = 0f32;
            for x in sg.iter_mut() {
                *x = exp_neg::<FMA>(*x - m_new);
                sum += *x;
            }
            l[g] += sum;
        }
        let values = &job.v_cache[base * slot_width..][..n * slot_width];
        for (k, slot) in values.chunks_exact(slot_width).enumerate() {
            for (h, value) in slot.chunks_exact(hd).enumerate() {
                for g in h * group..(h + 1) * group {
                    axpy::<FMA, C>(&mut acc[g * hd..][..hd], s[g * bs + k], value);
                }
            }
        }
        j += n;
    }
    match out {
        Span::Whole(out) => {
            for g in 0..heads {
                store_head(&acc[g * hd..][..hd], l[g], &mut out[g * hd..][..hd]);
            }
        }
        Span::Part(_, _, part) => {
            part[..heads].copy_from_slice(m);
            part[heads..2 * heads].copy_from_slice(l);
            part[2 * heads..].copy_from_slice(acc);
        }
    }
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
