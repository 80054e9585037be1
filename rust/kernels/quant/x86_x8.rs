//! The x86 kernels over interleaved weights (`interleave`): per block column of a run of 8
//! weight rows, each 32-byte chunk of integers meets the activation's 4 matching values
//! broadcast to every 32-bit lane, so lane `r` sums row `r`'s products in `i32`; then one
//! multiply-add by the 8 rows' scales times the activation group's scale, and for the formats
//! with a min one more by the 8 mins times the group's sum. Each chunk is loaded and unpacked
//! once per tile of up to `MAX_TILE` activation rows.

#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::blocks::{BlockType, GROUP};
use super::interleave::{halves, header_bytes, high_bytes, ROWS};
use super::work::Work;
use super::x86::{Dot, Tile, MAX_TILE};
use crate::kernels::simd::Elem;

/// The 4 activation bytes at `p`, in every lane.
#[inline(always)]
unsafe fn lanes4(p: *const i8) -> __m256i {
    // SAFETY: `p` addresses 4 readable bytes.
    unsafe { _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32)) }
}

/// Bit 4 of every byte of lane `r` set from row `r`'s fifth bits (`qh`, one row per lane)
/// for nibble quartet `q` (values `4q..4q + 4`): byte `k` takes bit `4q + k`.
#[inline(always)]
unsafe fn fifth_bits_x8(qh: __m256i, q: usize) -> __m256i {
    // SAFETY: AVX2 only.
    unsafe {
        // Each byte of lane `r` takes byte `q / 2` of that lane's word (the shuffle indexes
        // within each 128-bit half, which holds 4 lanes).
        let lanes = _mm256_setr_epi8(
            0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8,
            12, 12, 12, 12,
        );
        let spread = _mm256_add_epi8(lanes, _mm256_set1_epi8((q / 2) as i8));
        let bit = _mm256_set1_epi32((0x0804_0201u32 << (4 * (q % 2))) as i32);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, spread), bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
}

/// One block column `b` (at `p`) of a run of 8 rows against the tile's rows, into `acc`.
#[inline(always)]
unsafe fn column<D: Dot, const R: usize>(
    ty: BlockType,
    acc: &mut [__m256; R],
    p: *const u8,
    x: &Tile<R>,
    b: usize,
) {
    // SAFETY: `p` addresses one whole block column; the tile's rows hold group `b`.
    unsafe {
        let d = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let ints = p.add(header_bytes(ty));
        let mut sum = [[_mm256_setzero_si256(); 2]; R];
        if ty == BlockType::Q8_0 {
            for c in 0..GROUP / 4 {
                let w = _mm256_loadu_si256(ints.add(32 * c) as *const __m256i);
                let wu = _mm256_sign_epi8(w, w);
                for r in 0..R {
                    let xs = _mm256_sign_epi8(lanes4(x.q[r].add(b * GROUP + 4 * c)), w);
                    sum[r][c % 2] = D::dot_acc(sum[r][c % 2], wu, xs);
                }
            }
        } else {
            let m4 = _mm256_set1_epi8(0x0f);
            let five = high_bytes(ty) > 0;
            let qh = if five {
                _mm256_loadu_si256(p.add(2 * halves(ty) * ROWS) as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            for c in 0..4 {
                let raw = _mm256_loadu_si256(ints.add(32 * c) as *const __m256i);
                let mut lo = _mm256_and_si256(raw, m4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                if five {
                    lo = _mm256_or_si256(lo, fifth_bits_x8(qh, c));
                    hi = _mm256_or_si256(hi, fifth_bits_x8(qh, 4 + c));
                }
                for r in 0..R {
                    let xr = x.q[r].add(b * GROUP);
                    sum[r][0] = D::dot_acc(sum[r][0], lo, lanes4(xr.add(4 * c)));
                    sum[r][1] = D::dot_acc(sum[r][1], hi, lanes4(xr.add(16 + 4 * c)));
                }
            }
        }
        let min = match ty {
            BlockType::Q4_1 | BlockType::Q5_1 => Some(_mm256_cvtph_ps(_mm_loadu_si128(
                p.add(2 * ROWS) as *const __m128i,
            ))),
            BlockType::Q4_0 => Some(_mm256_mul_ps(d, _mm256_set1_ps(-8.0))),
            BlockType::Q5_0 => Some(_mm256_mul_ps(d, _mm256_set1_ps(-16.0))),
            _ => None,
        };
        for r in 0..R {
            let total = _mm256_cvtepi32_ps(_mm256_add_epi32(sum[r][0], sum[r][1]));
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(*x.d[r].add(b)));
            acc[r] = _mm256_fmadd_ps(total, scale, acc[r]);
            if let Some(m) = min {
                acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(*x.s[r].add(b)), acc[r]);
            }
        }
    }
}

/// Run `run` (8 interleaved rows, `num_blocks` block columns of `ty`) against the tile's rows.
#[inline(always)]
unsafe fn run_rows<D: Dot, const R: usize>(
    ty: BlockType,
    run: *const u8,
    num_blocks: usize,
    x: &Tile<R>,
) -> [[f32; ROWS]; R] {
    let stride = ROWS * ty.block_bytes();
    // SAFETY: `run` addresses `num_blocks` block columns; the tile's rows hold as many groups.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); R];
        // Each arm passes its type as a constant, which the inlined loop specializes on.
        match ty {
            BlockType::Q4_0 => {
                for b in 0..num_blocks {
                    column::<D, R>(BlockType::Q4_0, &mut acc, run.add(b * stride), x, b);
                }
            }
            BlockType::Q4_1 => {
                for b in 0..num_blocks {
                    column::<D, R>(BlockType::Q4_1, &mut acc, run.add(b * stride), x, b);
                }
            }
            BlockType::Q5_0 => {
                for b in 0..num_blocks {
                    column::<D, R>(BlockType::Q5_0, &mut acc, run.add(b * stride), x, b);
                }
            }
            BlockType::Q5_1 => {
                for b in 0..num_blocks {
                    column::<D, R>(BlockType::Q5_1, &mut acc, run.add(b * stride), x, b);
                }
            }
            _ => {
                for b in 0..num_blocks {
                    column::<D, R>(BlockType::Q8_0, &mut acc, run.add(b * stride), x, b);
                }
            }
        }
        let mut out = [[0f32; ROWS]; R];
        for r in 0..R {
            _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]);
        }
        out
    }
}

/// Stores tile rows `r..r + R`'s products with the `W` weight rows `n..n + W` (one run here,
/// two in `x86_x16`).
#[inline(always)]
pub(super) unsafe fn store<X: Elem, const R: usize, const W: usize>(
    work: &Work<'_, X>,
    r: usize,
    n: usize,
    v: [[f32; W]; R],
) {
    for i in 0..R {
        for (j, &value) in v[i].iter().enumerate() {
            // SAFETY: the caller's contract (rows and columns of this work).
            unsafe { work.store::<1>(r + i, n + j, [value]) };
        }
    }
}

/// Every interleaved run of `work` against every activation row.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C and `D`'s features; `work` holds whole interleaved runs
/// of a type `interleave::packs` and satisfies `Work`'s contract.
#[inline(always)]
pub unsafe fn interleaved<D: Dot, X: Elem>(work: &Work<'_, X>) {
    for i in 0..work.w.len() / (ROWS * work.row_bytes) {
        // SAFETY: the caller's contract; `i` is a run of `work`.
        unsafe { run_against_all::<D, X>(work, i) };
    }
}

/// Run `i` of `work` (weight rows `8i..8i + 8`) against every activation row.
///
/// # Safety
/// As `interleaved`, and `i` is one of `work`'s runs.
#[inline(always)]
pub unsafe fn run_against_all<D: Dot, X: Elem>(work: &Work<'_, X>, i: usize) {
    let num_blocks = work.row_bytes / work.ty.block_bytes();
    let m = work.x.m;
    // SAFETY: run `i` is in `work.w`, by the contract.
    let w = unsafe { work.w.as_ptr().add(i * ROWS * work.row_bytes) };
    let n = i * ROWS;
    let mut r = 0;
    while r < m {
        let take = (m - r).min(MAX_TILE);
        // SAFETY: the caller's contract; `r + take <= m`.
        unsafe {
            match take {
                4 => store(
                    work,
                    r,
                    n,
                    run_rows::<D, 4>(work.ty, w, num_blocks, &Tile::new(work.x, r)),
                ),
                3 => store(
                    work,
                    r,
                    n,
                    run_rows::<D, 3>(work.ty, w, num_blocks, &Tile::new(work.x, r)),
                ),
                2 => store(
                    work,
                    r,
                    n,
                    run_rows::<D, 2>(work.ty, w, num_blocks, &Tile::new(work.x, r)),
                ),
                _ => store(
                    work,
                    r,
                    n,
                    run_rows::<D, 1>(work.ty, w, num_blocks, &Tile::new(work.x, r)),
                ),
            }
        }
        r += take;
    }
}
