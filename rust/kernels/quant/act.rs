//! Activations quantized once per matmul: each group of 32 values of a row becomes 32 `i8`
//! and a scale, `x[j] ~ q[j] * d` with `d = max|x| / 127` (so `|x[j] - q[j] * d| <= d / 2`),
//! plus `s = d * sum(q)`, which the formats with a min need (`sum_j min * x[j]`).
//!
//! Every weight format is read in the same groups of 32 (`blocks::Group`), so one activation
//! format serves all of them, and a finer scale than a 256-value super-block keeps more
//! precision for the K-quants.

use super::blocks::GROUP;
use crate::kernels::simd::Elem;

/// `m` rows of `k` values (`k` a multiple of 32), quantized in groups of 32.
pub struct QuantizedRows {
    /// Rows.
    pub m: usize,
    /// Values per row.
    pub k: usize,
    /// `[m, k]` integers in -127..=127.
    pub q: Vec<i8>,
    /// `[m, k / 32]` scales.
    pub d: Vec<f32>,
    /// `[m, k / 32]` `d * sum(q)` of each group.
    pub s: Vec<f32>,
}

impl QuantizedRows {
    /// Empty rows of the given size, to fill with `quantize_row`.
    pub fn new(m: usize, k: usize) -> Self {
        debug_assert!(k.is_multiple_of(GROUP));
        let groups = m * (k / GROUP);
        Self {
            m,
            k,
            q: vec![0; m * k],
            d: vec![0.0; groups],
            s: vec![0.0; groups],
        }
    }

    /// Row `r` as (integers, scales, sums).
    pub fn row(&self, r: usize) -> (&[i8], &[f32], &[f32]) {
        let groups = self.k / GROUP;
        (
            &self.q[r * self.k..][..self.k],
            &self.d[r * groups..][..groups],
            &self.s[r * groups..][..groups],
        )
    }

    /// Row `r`, mutable.
    pub fn row_mut(&mut self, r: usize) -> (&mut [i8], &mut [f32], &mut [f32]) {
        let groups = self.k / GROUP;
        (
            &mut self.q[r * self.k..][..self.k],
            &mut self.d[r * groups..][..groups],
            &mut self.s[r * groups..][..groups],
        )
    }
}

/// Rounds `v` (|v| < 2^22) to the nearest integer, ties to even, with two additions that
/// vectorize on any x86-64 (`f32::round` is a libm call without SSE4.1).
#[inline(always)]
fn round(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    (v + MAGIC) - MAGIC
}

/// Quantizes one row `x` (`k` values) into `(q, d, s)`. Inlined into each ISA's caller so
/// it vectorizes at that width.
#[inline(always)]
pub fn quantize_row<X: Elem>(x: &[X], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (((xg, qg), dg), sg) in x
        .chunks_exact(GROUP)
        .zip(q.chunks_exact_mut(GROUP))
        .zip(d.iter_mut())
        .zip(s.iter_mut())
    {
        let mut v = [0f32; GROUP];
        for (a, b) in v.iter_mut().zip(xg) {
            *a = b.to_f32();
        }
        let amax = v.iter().fold(0f32, |a, &b| a.max(b.abs()));
        let scale = amax / 127.0;
        let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (qv, &xv) in qg.iter_mut().zip(&v) {
            let r = round(xv * inv);
            *qv = r as i8;
            sum += r as i32;
        }
        *dg = scale;
        *sg = scale * sum as f32;
    }
}
