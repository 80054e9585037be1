//! Dense, branch-free passes over a logits row, written so that LLVM vectorises them: fixed lane
//! arrays instead of iterator folds, selects instead of branches, and an `exp` built from
//! arithmetic and bit operations (libm's `expf` is a call per element and never vectorises).
//!
//! Sums run in a fixed order (8 lanes per 256-element block, blocks added in `f64`), so a result
//! does not depend on the vector width the compiler picked: the same row gives the same bits.
//! NaN never wins a comparison here, so a NaN in a row behaves as `-inf`.

/// Lanes of the hand-unrolled reductions; 8 `f32` fill one AVX register, two SSE registers.
const LANES: usize = 8;
/// Elements summed in `f32` before the block's sum is added to the `f64` total.
const BLOCK: usize = 256;

/// Defines `pub(crate) fn $name`, which runs `$any` compiled for AVX2 when the CPU has it (and
/// `FERROLLM_CPU_ISA` allows it: `crate::kernels::CpuFeatures`) and for the baseline otherwise. Both builds run the same operations, only on wider registers:
/// Rust never fuses a multiply and an add on its own and every sum here has a fixed order, so
/// the results are the same bits (the tests compare them).
macro_rules! dispatch {
    ($(#[$doc:meta])* fn $name:ident $(<$($g:ident: $b:path),+>)? ($($arg:ident: $ty:ty),*) -> $ret:ty = $any:ident) => {
        $(#[$doc])*
        pub(crate) fn $name $(<$($g: $b),+>)? ($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            if $crate::kernels::CpuFeatures::get().tier >= $crate::kernels::KernelTier::Avx2 {
                #[target_feature(enable = "avx2")]
                fn wide $(<$($g: $b),+>)? ($($arg: $ty),*) -> $ret {
                    $any($($arg),*)
                }
                // SAFETY: the CPU has AVX2 (and FMA), checked just above.
                return unsafe { wide($($arg),*) };
            }
            $any($($arg),*)
        }
    };
}
pub(crate) use dispatch;

/// `exp(x)` for `x <= 0` (the Cephes `expf` polynomial, within 2 ulp of the exact value);
/// below -87 (and for NaN or `-inf`) it returns exactly 0, so banned tokens weigh nothing.
#[inline(always)]
pub(crate) fn exp_neg(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // 1.5 * 2^23: adding it rounds to the nearest integer and leaves that integer in the low
    // mantissa bits, which SSE2 can do without a rounding instruction.
    const MAGIC: f32 = 12_582_912.0;
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    // Two selects the vectoriser maps to max/min (NaN ends up at -87, then weighs 0).
    let xc = if x > -87.0 { x } else { -87.0 };
    let xc = if xc < 0.0 { xc } else { 0.0 };
    let t = xc * LOG2E + MAGIC;
    let n = t - MAGIC;
    let n_int = t.to_bits() as i32 - 0x4B40_0000;
    // ln 2 split in two so that n * C1 is exact and the reduction loses no bits.
    let r = xc - n * C1 - n * C2;
    let poly = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
        * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let y = poly * (r * r) + r + 1.0;
    // n is in [-126, 0] here, so 2^n is a normal float built from its exponent bits.
    let scale = f32::from_bits(((n_int + 127) as u32) << 23);
    let y = y * scale;
    if x > -87.0 {
        y
    } else {
        0.0
    }
}

#[inline(always)]
fn max_lanes(acc: &mut [f32; LANES], xs: &[f32]) {
    for chunk in xs.chunks_exact(LANES) {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a = if v > *a { v } else { *a };
        }
    }
    for &v in xs.chunks_exact(LANES).remainder() {
        acc[0] = if v > acc[0] { v } else { acc[0] };
    }
}

fn reduce_max(acc: &[f32; LANES]) -> f32 {
    acc.iter()
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

/// The largest value of `xs` ignoring NaN; `-inf` when there is none.
#[inline(always)]
pub(crate) fn max_of(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    max_lanes(&mut acc, xs);
    reduce_max(&acc)
}

dispatch! {
    /// [`max_of`] over a whole row.
    fn row_max(xs: &[f32]) -> f32 = max_of
}

dispatch! {
    /// The lowest index holding the largest value (NaN ignored); `None` when no value beats
    /// `-inf`. One pass: each lane keeps its first maximum, then lanes merge by (value, index).
    fn argmax(xs: &[f32]) -> Option<usize> = argmax_any
}

#[inline(always)]
fn argmax_any(xs: &[f32]) -> Option<usize> {
    let mut best = [f32::NEG_INFINITY; LANES];
    let mut at = [0u32; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for (c, chunk) in (&mut chunks).enumerate() {
        let base = (c * LANES) as u32;
        for j in 0..LANES {
            let better = chunk[j] > best[j];
            best[j] = if better { chunk[j] } else { best[j] };
            at[j] = if better { base + j as u32 } else { at[j] };
        }
    }
    let mut found: Option<(f32, usize)> = None;
    let tail = chunks.remainder().iter().enumerate();
    let lanes = best.iter().zip(at).map(|(&v, i)| (v, i as usize));
    for (v, i) in lanes.chain(tail.map(|(j, &v)| (v, xs.len() - xs.len() % LANES + j))) {
        let wins = match found {
            None => v > f32::NEG_INFINITY,
            Some((bv, bi)) => v > bv || (v == bv && i < bi),
        };
        if wins {
            found = Some((v, i));
        }
    }
    found.map(|(_, i)| i)
}

dispatch! {
    /// Copies `src` into `dst`, turning NaN into `-inf` (the one rule for NaN logits).
    fn copy_sanitized(dst: &mut [f32], src: &[f32]) -> () = copy_sanitized_any
}

#[inline(always)]
fn copy_sanitized_any(dst: &mut [f32], src: &[f32]) {
    for (d, &v) in dst.iter_mut().zip(src) {
        *d = if v.is_nan() { f32::NEG_INFINITY } else { v };
    }
}

/// Turns NaN into `-inf` in place.
pub(crate) fn sanitize(xs: &mut [f32]) {
    for v in xs.iter_mut() {
        *v = if v.is_nan() { f32::NEG_INFINITY } else { *v };
    }
}

/// Divides every value by `t` (the temperature step).
pub(crate) fn divide(xs: &mut [f32], t: f32) {
    for v in xs.iter_mut() {
        *v /= t;
    }
}

#[inline(always)]
fn sum_lanes(acc: &[f32; LANES]) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// The temperature as the filters see it: processed logits are `x / t`. Dividing while reading
/// gives the very bits a divided row would hold (and `max(x) / t == max(x / t)`, as rounding is
/// monotone), so the hot path needs no separate division pass.
pub(crate) trait Scale: Copy {
    fn apply(self, x: f32) -> f32;
}

/// Temperature 1 (or a row that is already divided).
#[derive(Clone, Copy)]
pub(crate) struct Unit;

/// Division by a temperature.
#[derive(Clone, Copy)]
pub(crate) struct Div(pub f32);

impl Scale for Unit {
    #[inline(always)]
    fn apply(self, x: f32) -> f32 {
        x
    }
}

impl Scale for Div {
    #[inline(always)]
    fn apply(self, x: f32) -> f32 {
        x / self.0
    }
}

/// Calls `$body` with `$s` bound to the [`Scale`] of temperature `$t`, monomorphised per kind.
macro_rules! with_scale {
    ($t:expr, |$s:ident| $body:expr) => {{
        let t: f32 = $t;
        if t == 1.0 {
            let $s = $crate::sampling::kernels::Unit;
            $body
        } else {
            let $s = $crate::sampling::kernels::Div(t);
            $body
        }
    }};
}
pub(crate) use with_scale;

/// `out[i] = exp(s(xs[i]) - m)`: a plain loop, which the loop vectoriser handles best.
#[inline(always)]
fn exp_block<S: Scale>(xs: &[f32], s: S, m: f32, out: &mut [f32]) {
    for (o, &x) in out.iter_mut().zip(xs) {
        *o = exp_neg(s.apply(x) - m);
    }
}

/// The sum of a block in a fixed order: 8 lane sums, then a fixed tree.
#[inline(always)]
fn sum_block(xs: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    for &v in chunks.remainder() {
        acc[0] += v;
    }
    sum_lanes(&acc)
}

dispatch! {
    /// Writes `out[i] = exp(xs[i] / t - m)` and returns their sum (`m` is the finite maximum of
    /// the scaled row, so every weight is in [0, 1] and the largest is exactly 1).
    fn exp_shifted<S: Scale>(xs: &[f32], s: S, m: f32, out: &mut [f32]) -> f64 = exp_shifted_any
}

#[inline(always)]
fn exp_shifted_any<S: Scale>(xs: &[f32], s: S, m: f32, out: &mut [f32]) -> f64 {
    let mut total = 0.0f64;
    for (xb, ob) in xs.chunks(BLOCK).zip(out.chunks_mut(BLOCK)) {
        exp_block(xb, s, m, ob);
        total += f64::from(sum_block(ob));
    }
    total
}

dispatch! {
    /// `sum(exp(xs[i] - m))` without storing the terms (the raw row's log-normaliser); the
    /// same bits as the sum [`exp_shifted`] returns.
    fn sum_exp_shifted(xs: &[f32], m: f32) -> f64 = sum_exp_shifted_any
}

#[inline(always)]
fn sum_exp_shifted_any(xs: &[f32], m: f32) -> f64 {
    let mut total = 0.0f64;
    let mut buf = [0.0f32; BLOCK];
    for xb in xs.chunks(BLOCK) {
        let out = &mut buf[..xb.len()];
        exp_block(xb, Unit, m, out);
        total += f64::from(sum_block(out));
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_neg_is_within_two_ulp_and_exact_at_the_ends() {
        assert_eq!(exp_neg(0.0), 1.0);
        assert_eq!(exp_neg(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_neg(f32::NAN), 0.0);
        assert_eq!(exp_neg(-88.0), 0.0);
        let mut worst = 0.0f64;
        let mut x = -86.99f32;
        while x <= 0.0 {
            let exact = f64::from(x).exp();
            let got = f64::from(exp_neg(x));
            worst = worst.max(((got - exact) / exact).abs());
            x += 0.000_731;
        }
        assert!(worst < 2.5e-7, "max relative error {worst}");
    }

    #[test]
    fn reductions_ignore_nan_and_match_plain_loops() {
        let xs: Vec<f32> = (0..1001).map(|i| ((i * 37) % 101) as f32 * -0.1).collect();
        let mut with_nan = xs.clone();
        with_nan[500] = f32::NAN;
        assert_eq!(max_of(&with_nan), 0.0);
        assert_eq!(argmax(&with_nan), Some(0));
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NAN]), None);
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), Some(1));
        let mut long = vec![0.0f32; 37];
        for i in [3, 11, 19, 36] {
            long[i] = 5.0;
        }
        assert_eq!(argmax(&long), Some(3));
        long[3] = 1.0;
        assert_eq!(argmax(&long), Some(11));
        assert_eq!(argmax(&long[..33]), Some(11));
        assert_eq!(argmax(&[f32::NEG_INFINITY; 20]), None);
        let mut out = vec![0.0; xs.len()];
        let total = exp_shifted(&xs, Unit, 0.0, &mut out);
        let naive: f64 = xs.iter().map(|&x| f64::from(x).exp()).sum();
        assert!((total - naive).abs() < 1e-5 * naive);
        assert_eq!(sum_exp_shifted(&xs, 0.0), total);
        // The AVX2 build (when the CPU has it) gives the baseline build's bits.
        let mut base = vec![0.0; xs.len()];
        assert_eq!(exp_shifted_any(&xs, Unit, 0.0, &mut base), total);
        assert_eq!(base, out);
        assert_eq!(sum_exp_shifted_any(&xs, 0.0), total);
        let mut copied = vec![0.0; with_nan.len()];
        let mut copied_any = vec![1.0; with_nan.len()];
        copy_sanitized(&mut copied, &with_nan);
        copy_sanitized_any(&mut copied_any, &with_nan);
        assert_eq!(copied, copied_any);
        assert_eq!(copied[500], f32::NEG_INFINITY);
        assert_eq!(argmax_any(&xs), argmax(&xs));
        let mut halved = vec![0.0; xs.len()];
        let by_div = exp_shifted(&xs, Div(0.5), 0.0, &mut halved);
        let doubled: Vec<f32> = xs.iter().map(|&x| x / 0.5).collect();
        assert_eq!(by_div, exp_shifted(&doubled, Unit, 0.0, &mut out));
        assert_eq!(halved, out);
        let mut row = vec![f32::NAN, 1.0];
        sanitize(&mut row);
        assert_eq!(row, [f32::NEG_INFINITY, 1.0]);
    }
}
