//! Element math of the kernels, written so LLVM vectorizes it: fixed-width lane arrays instead
//! of float reductions (which it may not reorder), and an `exp` without branches or libm calls.
//! Every function is `#[inline(always)]` so it takes the target features of the caller (see
//! `attention::Variant`); `FMA` picks fused multiply-adds, which are a libm call without the
//! `fma` feature.

use half::bf16;

/// A tensor element the kernels read and write: float32 or bfloat16, computed in float32.
pub trait Elem: Copy + Send + Sync + 'static {
    /// The value as float32 (exact for both types).
    fn to_f32(self) -> f32;
    /// `x` rounded to this type (round to nearest even for bfloat16).
    fn from_f32(x: f32) -> Self;
}

impl Elem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Elem for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        // bfloat16 is the top half of a float32.
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

const LANES: usize = 16;

#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `sum(a[i] * b[i])` over `a.len()` elements (`b` at least as long).
#[inline(always)]
pub(crate) fn dot<const FMA: bool, C: Elem>(a: &[f32], b: &[C]) -> f32 {
    let b = &b[..a.len()];
    let mut acc = [0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..LANES {
            acc[l] = madd::<FMA>(x[l], y[l].to_f32(), acc[l]);
        }
    }
    let mut tail = 0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail = madd::<FMA>(*x, y.to_f32(), tail);
    }
    // Pairwise, so the sum vectorizes too.
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    acc[0] + tail
}

/// `acc[i] += p * x[i]` over `acc.len()` elements.
#[inline(always)]
pub(crate) fn axpy<const FMA: bool, C: Elem>(acc: &mut [f32], p: f32, x: &[C]) {
    for (a, v) in acc.iter_mut().zip(x) {
        *a = madd::<FMA>(p, v.to_f32(), *a);
    }
}

/// `e^x` for `x <= 0` (what softmax needs), within 2 ulp; 0 for `x < -87` and `-inf`.
///
/// Range reduction `x = n ln2 + r` with `|r| <= ln2 / 2`, then a degree-7 Taylor polynomial of
/// `e^r` (error below 1e-8 relative) scaled by `2^n` built in the exponent bits.
#[inline(always)]
pub(crate) fn exp_neg<const FMA: bool>(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding then subtracting 1.5 * 2^23 rounds to the nearest integer with plain arithmetic.
    const ROUND: f32 = 12_582_912.0;
    let underflow = x < -87.0;
    let x = x.max(-87.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = madd::<FMA>(-n, LN2_LO, madd::<FMA>(-n, LN2_HI, x));
    let mut p = 1.0 / 5040.0;
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = madd::<FMA>(p, r, c);
    }
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    if underflow {
        0.0
    } else {
        p * scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_neg_matches_std_within_2_ulp() {
        let mut x = 0.0f32;
        while x > -87.0 {
            let (got, want) = (exp_neg::<false>(x), x.exp());
            let ulp = (want.to_bits() as i64 - got.to_bits() as i64).abs();
            assert!(ulp <= 2, "exp({x}) = {got}, want {want}");
            x -= 0.001_37;
        }
        assert_eq!(exp_neg::<false>(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_neg::<true>(-100.0), 0.0);
        assert_eq!(exp_neg::<true>(0.0), 1.0);
    }

    #[test]
    fn dot_and_axpy_match_scalar_for_every_length() {
        for len in 0..70 {
            let a: Vec<f32> = (0..len).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<bf16> = (0..len)
                .map(|i| bf16::from_f32(i as f32 * 0.1 - 2.0))
                .collect();
            let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y.to_f32()).sum();
            assert!((dot::<true, bf16>(&a, &b) - want).abs() < 1e-4);
            let mut acc = a.clone();
            axpy::<false, bf16>(&mut acc, 2.0, &b);
            for i in 0..len {
                assert_eq!(acc[i], a[i] + 2.0 * b[i].to_f32());
            }
        }
    }

    #[test]
    fn bf16_round_trips_through_f32() {
        for x in [0.0f32, 1.0, -3.5, 1e-3, 65504.0] {
            let h = <bf16 as Elem>::from_f32(x);
            assert_eq!(<bf16 as Elem>::from_f32(h.to_f32()), h);
        }
    }
}
