//! The AVX512-VNNI kernel at 512 bits over interleaved weights (`interleave`): two adjacent
//! runs of 8 weight rows side by side in one register, lanes `0..8` the first run's rows and
//! `8..16` the second's. Each 4-byte broadcast of the activation and each `vpdpbusd` then
//! serves 16 weight rows instead of `x86_x8`'s 8, which halves the instructions per product
//! (the 256-bit kernel was bound by issuing them, not by memory, from 8 activation rows up).
//! Q4_0, Q4_1 and Q8_0 take this path; the fifth-bit formats, and a last run without a
//! partner, go through `x86_x8`.

#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::blocks::{BlockType, GROUP};
use super::interleave::{header_bytes, ROWS};
use super::work::Work;
use super::x86::{Avx512Vnni, Tile, MAX_TILE};
use super::x86_x8::{self, store};
use crate::kernels::simd::Elem;

/// Weight rows per register: two runs.
const PAIR: usize = 2 * ROWS;

/// Activation rows from which pairs of runs pay: measured on an AMD EPYC with AVX512-VNNI
/// (`benches/linear.py`), the 512-bit kernel was 1.15-1.2x faster at 32 rows, even at 8 on
/// weights that stay in cache, but up to 2x slower at 1 row on the 30 MB output projection,
/// where two runs read side by side are two short streams (4.9 KB each) instead of one long
/// one, and prefetching them ahead made it slower still.
const MIN_ROWS: usize = 16;

/// Whether `ty` has a 512-bit column here.
fn pairs(ty: BlockType) -> bool {
    matches!(ty, BlockType::Q4_0 | BlockType::Q4_1 | BlockType::Q8_0)
}

/// 32 bytes at `a` in the low half, 32 at `b` in the high half.
#[inline(always)]
unsafe fn join(a: *const u8, b: *const u8) -> __m512i {
    // SAFETY: both address 32 readable bytes.
    unsafe {
        let lo = _mm512_castsi256_si512(_mm256_loadu_si256(a as *const __m256i));
        _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(b as *const __m256i))
    }
}

/// 8 float16 at `a` and 8 at `b`, as 16 float32.
#[inline(always)]
unsafe fn join_halves(a: *const u8, b: *const u8) -> __m512 {
    // SAFETY: both address 16 readable bytes.
    unsafe {
        let lo = _mm256_castsi128_si256(_mm_loadu_si128(a as *const __m128i));
        _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(
            lo,
            _mm_loadu_si128(b as *const __m128i),
        ))
    }
}

/// The 4 activation bytes at `p`, in every lane.
#[inline(always)]
unsafe fn lanes4(p: *const i8) -> __m512i {
    // SAFETY: `p` addresses 4 readable bytes.
    unsafe { _mm512_set1_epi32(std::ptr::read_unaligned(p as *const i32)) }
}

/// Block column `b` of two runs (at `p0` and `p1`) against the tile's rows, into `acc`.
#[inline(always)]
unsafe fn column<const R: usize>(
    ty: BlockType,
    acc: &mut [__m512; R],
    p0: *const u8,
    p1: *const u8,
    x: &Tile<R>,
    b: usize,
) {
    // SAFETY: `p0` and `p1` address one whole block column each; the tile's rows hold group
    // `b`.
    unsafe {
        let d = join_halves(p0, p1);
        let (i0, i1) = (p0.add(header_bytes(ty)), p1.add(header_bytes(ty)));
        let mut sum = [[_mm512_setzero_si512(); 2]; R];
        if ty == BlockType::Q8_0 {
            // `vpdpbusd` multiplies unsigned by signed bytes: |w| against x with w's sign.
            let zero = _mm512_setzero_si512();
            for c in 0..GROUP / 4 {
                let w = join(i0.add(32 * c), i1.add(32 * c));
                let (wu, neg) = (_mm512_abs_epi8(w), _mm512_movepi8_mask(w));
                for r in 0..R {
                    let xr = lanes4(x.q[r].add(b * GROUP + 4 * c));
                    let xs = _mm512_mask_sub_epi8(xr, neg, zero, xr);
                    sum[r][c % 2] = _mm512_dpbusd_epi32(sum[r][c % 2], wu, xs);
                }
            }
        } else {
            let m4 = _mm512_set1_epi8(0x0f);
            for c in 0..4 {
                let raw = join(i0.add(32 * c), i1.add(32 * c));
                let lo = _mm512_and_si512(raw, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi32::<4>(raw), m4);
                for r in 0..R {
                    let xr = x.q[r].add(b * GROUP);
                    sum[r][0] = _mm512_dpbusd_epi32(sum[r][0], lo, lanes4(xr.add(4 * c)));
                    sum[r][1] = _mm512_dpbusd_epi32(sum[r][1], hi, lanes4(xr.add(16 + 4 * c)));
                }
            }
        }
        let min = match ty {
            BlockType::Q4_1 => Some(join_halves(p0.add(2 * ROWS), p1.add(2 * ROWS))),
            BlockType::Q4_0 => Some(_mm512_mul_ps(d, _mm512_set1_ps(-8.0))),
            _ => None,
        };
        for r in 0..R {
            let total = _mm512_cvtepi32_ps(_mm512_add_epi32(sum[r][0], sum[r][1]));
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(*x.d[r].add(b)));
            acc[r] = _mm512_fmadd_ps(total, scale, acc[r]);
            if let Some(m) = min {
                acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(*x.s[r].add(b)), acc[r]);
            }
        }
    }
}

/// Two runs (at `run0` and `run1`, `num_blocks` block columns of `ty` each) against the
/// tile's rows: row `r`'s 16 products, the first run's rows first.
#[inline(always)]
unsafe fn run_pair<const R: usize>(
    ty: BlockType,
    run0: *const u8,
    run1: *const u8,
    num_blocks: usize,
    x: &Tile<R>,
) -> [[f32; PAIR]; R] {
    let stride = ROWS * ty.block_bytes();
    // SAFETY: both runs address `num_blocks` block columns; the tile's rows hold as many
    // groups.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); R];
        // Each arm passes its type as a constant, which the inlined loop specializes on.
        macro_rules! columns {
            ($ty:expr) => {
                for b in 0..num_blocks {
                    let (p0, p1) = (run0.add(b * stride), run1.add(b * stride));
                    column::<R>($ty, &mut acc, p0, p1, x, b);
                }
            };
        }
        match ty {
            BlockType::Q4_0 => columns!(BlockType::Q4_0),
            BlockType::Q4_1 => columns!(BlockType::Q4_1),
            _ => columns!(BlockType::Q8_0),
        }
        let mut out = [[0f32; PAIR]; R];
        for r in 0..R {
            _mm512_storeu_ps(out[r].as_mut_ptr(), acc[r]);
        }
        out
    }
}

/// Runs `i` and `i + 1` of `work` against every activation row.
///
/// # Safety
/// As `interleaved`; `i + 1` is a run of `work` and its type `pairs`.
#[inline(always)]
unsafe fn pair_against_all<X: Elem>(work: &Work<'_, X>, i: usize) {
    let num_blocks = work.row_bytes / work.ty.block_bytes();
    let run_bytes = ROWS * work.row_bytes;
    // SAFETY: runs `i` and `i + 1` are in `work.w`, by the contract.
    let (w0, w1) = unsafe {
        let w0 = work.w.as_ptr().add(i * run_bytes);
        (w0, w0.add(run_bytes))
    };
    let (n, m) = (i * ROWS, work.x.m);
    let mut r = 0;
    while r < m {
        let take = (m - r).min(MAX_TILE);
        // SAFETY: the caller's contract; `r + take <= m`.
        unsafe {
            macro_rules! tile {
                ($rows:literal) => {
                    store(
                        work,
                        r,
                        n,
                        run_pair::<$rows>(work.ty, w0, w1, num_blocks, &Tile::new(work.x, r)),
                    )
                };
            }
            match take {
                4 => tile!(4),
                3 => tile!(3),
                2 => tile!(2),
                _ => tile!(1),
            }
        }
        r += take;
    }
}

/// Every interleaved run of `work` against every activation row: pairs of runs at 512 bits
/// where the type has that column and there are `MIN_ROWS` activation rows, the rest by
/// `x86_x8`.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C, AVX512F, AVX512VL, AVX512BW and AVX512-VNNI; `work`
/// holds whole interleaved runs of a type `interleave::packs` and satisfies `Work`'s contract.
#[inline(always)]
pub unsafe fn interleaved<X: Elem>(work: &Work<'_, X>) {
    let runs = work.w.len() / (ROWS * work.row_bytes);
    let paired = if pairs(work.ty) && work.x.m >= MIN_ROWS {
        runs / 2 * 2
    } else {
        0
    };
    for i in (0..paired).step_by(2) {
        // SAFETY: the caller's contract; `i + 1 < paired <= runs`.
        unsafe { pair_against_all(work, i) };
    }
    for i in paired..runs {
        // SAFETY: the caller's contract; `i` is one of `work`'s runs.
        unsafe { x86_x8::run_against_all::<Avx512Vnni, X>(work, i) };
    }
}
