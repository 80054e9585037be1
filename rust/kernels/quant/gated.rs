//! A gated feed-forward block on block weights in one call: `down(silu(gate) * up)`, where
//! `gate | up` are the two halves of one weight's output rows (Llama's SwiGLU MLP). The
//! caller makes one call a layer instead of two products and an elementwise step between
//! them, and no intermediate tensor.

use super::{invalid, matmul, Path, Segment};
use crate::error::CoreResult;
use crate::kernels::cpu::{CpuFeatures, KernelTier};
use crate::kernels::pool::{self, SendPtr};
use crate::kernels::simd::exp_neg;

/// `out [m, down rows] = (silu(h[:, :i]) * h[:, i:]) @ down^T` with `h = x @ gate_up^T`
/// (`[m, 2i]`); `x` is `[m, k]` and `down`'s rows hold `i` values. Each product is `matmul`'s
/// (the activations, `x` then the gated `[m, i]`, quantized to int8 groups once per product).
#[allow(clippy::too_many_arguments)]
pub fn silu_mlp(
    x: &[f32],
    m: usize,
    k: usize,
    gate_up: &[Segment<'_>],
    down: &[Segment<'_>],
    out: &mut [f32],
    path: Path,
    parallel: bool,
) -> CoreResult<()> {
    let width: usize = gate_up.iter().map(|s| s.rows).sum();
    if !width.is_multiple_of(2) {
        let msg =
            format!("`gate_up` must have an even number of rows (gate, then up); got {width}");
        return Err(invalid("gate_up", msg));
    }
    let inner = width / 2;
    let mut h = vec![0f32; m * width];
    matmul(x, m, k, gate_up, &mut h, path, parallel)?;
    let mut gated = vec![0f32; m * inner];
    let gate_row = silu_variant();
    let gated_ptr = SendPtr(gated.as_mut_ptr());
    let row = |r: usize| {
        let (gate, up) = h[r * width..][..width].split_at(inner);
        // SAFETY: row `r`'s `inner` values of `gated`, disjoint from every other row's.
        let o = unsafe { std::slice::from_raw_parts_mut(gated_ptr.get().add(r * inner), inner) };
        // SAFETY: `silu_variant` returns a variant whose target features this CPU has.
        unsafe { gate_row(gate, up, o) };
    };
    if parallel && m > 1 {
        pool::run_jobs(m, &row);
    } else {
        (0..m).for_each(row);
    }
    matmul(&gated, m, inner, down, out, path, parallel)
}

/// `out[j] = silu(gate[j]) * up[j]`, `silu(g) = g / (1 + e^-g)`, its exponential `exp_neg`'s
/// (within 2 ulp, no libm call, so the loop vectorizes).
#[inline(always)]
fn silu_mul<const FMA: bool>(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        // e^-|g|, then the logistic from the side that cannot overflow.
        let t = exp_neg::<FMA>(-g.abs());
        let sigmoid = if g >= 0.0 { 1.0 } else { t } / (1.0 + t);
        *o = g * sigmoid * u;
    }
}

type GateFn = unsafe fn(&[f32], &[f32], &mut [f32]);

/// The widest `silu_mul` this CPU runs (the wheel targets baseline x86_64).
fn silu_variant() -> GateFn {
    #[cfg(target_arch = "x86_64")]
    match CpuFeatures::get().tier {
        KernelTier::Avx512 => return silu_avx512,
        KernelTier::Avx2 => return silu_avx2,
        KernelTier::Generic => {}
    }
    silu_generic
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn silu_avx512(gate: &[f32], up: &[f32], out: &mut [f32]) {
    silu_mul::<true>(gate, up, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_avx2(gate: &[f32], up: &[f32], out: &mut [f32]) {
    silu_mul::<true>(gate, up, out)
}

unsafe fn silu_generic(gate: &[f32], up: &[f32], out: &mut [f32]) {
    silu_mul::<false>(gate, up, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_mul_matches_the_definition() {
        let gate: Vec<f32> = (0..200).map(|i| (i as f32 - 100.0) * 0.37).collect();
        let up: Vec<f32> = (0..200).map(|i| (i as f32 * 0.11).sin()).collect();
        let mut out = vec![0f32; 200];
        // SAFETY: `silu_variant` picks what this CPU runs.
        unsafe { silu_variant()(&gate, &up, &mut out) };
        for ((o, g), u) in out.iter().zip(&gate).zip(&up) {
            let want = (f64::from(*g) / (1.0 + (-f64::from(*g)).exp()) * f64::from(*u)) as f32;
            assert!(
                (o - want).abs() <= 8.0 * f32::EPSILON * want.abs().max(1e-30),
                "{g}: {o} vs {want}"
            );
        }
    }
}
