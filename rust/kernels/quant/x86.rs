//! The x86 kernels: 256-bit integer dot products of unpacked weight groups with the quantized
//! activations, for a tile of up to `MAX_TILE` activation rows per weight row, so each weight
//! block is loaded and unpacked once per tile (the weights stream from memory once; the tile's
//! activations stay in L1/L2).
//!
//! Per group of 32 values and activation row: the weights as 32 bytes (`unpack_*`), a dot
//! product into 8 `i32` lanes (`Dot`: AVX2's `maddubs` + `madd`, or VNNI's `dpbusd`), then one
//! float multiply-add of those lanes by weight scale x activation scale. Lane `i` holds the
//! products of bytes `4i..4i+4`, so lanes 0-3 are the group's first 16 values and lanes 4-7
//! its last 16: Q6_K's two half-group scales are one vector. The formats with a min add
//! `min * s` (the activation group's sum) in scalar.
//!
//! `maddubs` multiplies unsigned by signed bytes: formats with a min (and Q4_0/Q5_0, whose
//! offset is written as one) are unpacked unsigned; Q8_0 and Q6_K are signed, multiplied as
//! `|w| * (x * sign(w))` (|w| <= 128 and |x| <= 127 keep the pairwise `i16` sums exact).

// Index loops over a tile's rows: several arrays are indexed alike, and an iterator adaptor
// LLVM declines to inline would lose the target features (see `row`).
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::act::QuantizedRows;
use super::blocks::{f16_to_f32, k_scale_min, BlockType, GROUP};
use super::work::Work;
use crate::kernels::cpu::CpuFeatures;
use crate::kernels::simd::Elem;

/// Activation rows computed together against one weight row.
pub const MAX_TILE: usize = 4;

/// 32 unsigned bytes times 32 signed bytes into 8 `i32` lanes of 4 products each.
pub trait Dot {
    /// # Safety
    /// The CPU must have the features of the implementation (see each).
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i;

    /// `acc` plus `dot(u, s)` (VNNI's instruction adds in place).
    ///
    /// # Safety
    /// As `dot`.
    #[inline(always)]
    unsafe fn dot_acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: as `dot`; AVX2 is in every implementation's features.
        unsafe { _mm256_add_epi32(acc, Self::dot(u, s)) }
    }
}

/// AVX2: `maddubs` (pairs into saturating `i16`, exact for our ranges), `madd` by ones.
pub struct Maddubs;
/// AVX-VNNI (VEX): one `vpdpbusd`.
pub struct AvxVnni;
/// AVX512-VNNI at 256 bits (AVX512VL).
pub struct Avx512Vnni;

impl Dot for Maddubs {
    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: AVX2, which every caller's target features include.
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)) }
    }
}

impl Dot for AvxVnni {
    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: AVX-VNNI, which the caller `tile_avxvnni` enables.
        unsafe { _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s) }
    }

    #[inline(always)]
    unsafe fn dot_acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: as `dot`.
        unsafe { _mm256_dpbusd_avx_epi32(acc, u, s) }
    }
}

impl Dot for Avx512Vnni {
    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: AVX512-VNNI and AVX512VL, which the caller `tile_avx512vnni` enables.
        unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s) }
    }

    #[inline(always)]
    unsafe fn dot_acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: as `dot`.
        unsafe { _mm256_dpbusd_epi32(acc, u, s) }
    }
}

/// A tile of activation rows: pointers to each row's integers, scales and sums.
#[derive(Clone, Copy)]
pub struct Tile<const R: usize> {
    pub(super) q: [*const i8; R],
    pub(super) d: [*const f32; R],
    pub(super) s: [*const f32; R],
}

impl<const R: usize> Tile<R> {
    /// Rows `first..first + R` of `x`.
    pub fn new(x: &QuantizedRows, first: usize) -> Self {
        let mut tile = Self {
            q: [std::ptr::null(); R],
            d: [std::ptr::null(); R],
            s: [std::ptr::null(); R],
        };
        for i in 0..R {
            let (q, d, s) = x.row(first + i);
            (tile.q[i], tile.d[i], tile.s[i]) = (q.as_ptr(), d.as_ptr(), s.as_ptr());
        }
        tile
    }
}

/// Running sums of one weight row against a tile, in two independent sets (even and odd
/// groups) so consecutive groups do not wait on each other's multiply-add: with one row, a
/// single chain of 4-cycle FMAs bounded the kernel at a block every 4 cycles.
struct Acc<const R: usize> {
    v: [[__m256; R]; 2],
    min: [[f32; R]; 2],
    /// Min terms of whole chunks of 8 blocks, one lane per block (`blocks_32`).
    min8: [__m256; R],
}

/// The float16 at `p` (see `blocks::f16_to_f32` for why not F16C).
#[inline(always)]
unsafe fn f16(p: *const u8) -> f32 {
    // SAFETY: `p` addresses 2 readable bytes.
    f16_to_f32(u16::from_le(unsafe {
        std::ptr::read_unaligned(p as *const u16)
    }))
}

/// Adds group `g` (weights `w`, `scale` per lane, `min`) against every row of the tile.
#[inline(always)]
unsafe fn group<D: Dot, const R: usize, const SIGNED: bool, const SET: usize>(
    acc: &mut Acc<R>,
    w: __m256i,
    scale: __m256,
    min: f32,
    x: &Tile<R>,
    g: usize,
) {
    // SAFETY: the tile's rows hold at least `g + 1` groups (checked by the caller's shapes).
    unsafe {
        let wu = if SIGNED { _mm256_sign_epi8(w, w) } else { w };
        for r in 0..R {
            let xq = _mm256_loadu_si256(x.q[r].add(g * GROUP) as *const __m256i);
            let xs = if SIGNED { _mm256_sign_epi8(xq, w) } else { xq };
            let p = _mm256_cvtepi32_ps(D::dot(wu, xs));
            let sc = _mm256_mul_ps(scale, _mm256_set1_ps(*x.d[r].add(g)));
            acc.v[SET][r] = _mm256_fmadd_ps(p, sc, acc.v[SET][r]);
            if !SIGNED {
                acc.min[SET][r] += min * *x.s[r].add(g);
            }
        }
    }
}

#[inline(always)]
unsafe fn nibbles_128(p: *const u8) -> __m256i {
    // SAFETY: `p` addresses 16 bytes of nibbles.
    unsafe {
        let raw = _mm_loadu_si128(p as *const __m128i);
        let m = _mm_set1_epi8(0x0f);
        _mm256_set_m128i(
            _mm_and_si128(_mm_srli_epi16(raw, 4), m),
            _mm_and_si128(raw, m),
        )
    }
}

/// Byte `j` = 0x10 where bit `j` of `qh` is set.
#[inline(always)]
unsafe fn fifth_bits(qh: u32) -> __m256i {
    // SAFETY: AVX2 only.
    unsafe {
        let v = _mm256_set1_epi32(qh as i32);
        let spread = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, spread), bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
}

/// Q4_0 / Q4_1 / Q5_0 / Q5_1 block `b` (group `b`), into sums `SET`.
#[inline(always)]
unsafe fn block_32<D: Dot, const R: usize, const SET: usize>(
    ty: BlockType,
    acc: &mut Acc<R>,
    p: *const u8,
    x: &Tile<R>,
    b: usize,
) {
    // SAFETY: `p` addresses one whole block of `ty`.
    unsafe {
        let d = f16(p);
        let with_min = matches!(ty, BlockType::Q4_1 | BlockType::Q5_1);
        let (min, rest) = if with_min {
            (f16(p.add(2)), p.add(4))
        } else if ty == BlockType::Q4_0 {
            (-8.0 * d, p.add(2))
        } else {
            (-16.0 * d, p.add(2))
        };
        let w = if matches!(ty, BlockType::Q4_0 | BlockType::Q4_1) {
            nibbles_128(rest)
        } else {
            let qh = std::ptr::read_unaligned(rest as *const u32);
            _mm256_or_si256(nibbles_128(rest.add(4)), fifth_bits(u32::from_le(qh)))
        };
        group::<D, R, false, SET>(acc, w, _mm256_set1_ps(d), min, x, b);
    }
}

#[inline(always)]
unsafe fn block_q8_0<D: Dot, const R: usize, const SET: usize>(
    acc: &mut Acc<R>,
    p: *const u8,
    x: &Tile<R>,
    b: usize,
) {
    // SAFETY: `p` addresses one Q8_0 block.
    unsafe {
        let w = _mm256_loadu_si256(p.add(2) as *const __m256i);
        group::<D, R, true, SET>(acc, w, _mm256_set1_ps(f16(p)), 0.0, x, b);
    }
}

/// Q4_K / Q5_K super-block `b` (groups `8b..8b + 8`).
#[inline(always)]
unsafe fn block_q45k<D: Dot, const R: usize>(
    five: bool,
    acc: &mut Acc<R>,
    p: *const u8,
    x: &Tile<R>,
    b: usize,
) {
    // SAFETY: `p` addresses one whole Q4_K (or Q5_K if `five`) block.
    unsafe {
        let (d, dmin) = (f16(p), f16(p.add(2)));
        let scales = std::slice::from_raw_parts(p.add(4), 12);
        let qs = p.add(if five { 48 } else { 16 });
        let mut qh = if five {
            _mm256_loadu_si256(p.add(16) as *const __m256i)
        } else {
            _mm256_setzero_si256()
        };
        let (m4, b4) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x10));
        for c in 0..4 {
            let raw = _mm256_loadu_si256(qs.add(32 * c) as *const __m256i);
            let mut lo = _mm256_and_si256(raw, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            if five {
                // Bits 2c and 2c + 1 of each byte (brought down to bits 0 and 1) become bit 4.
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(qh, 4), b4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(qh, 3), b4));
                qh = _mm256_srli_epi16(qh, 2);
            }
            let (sc, m) = k_scale_min(scales, 2 * c);
            let (scale, min) = (_mm256_set1_ps(d * f32::from(sc)), -(dmin * f32::from(m)));
            group::<D, R, false, 0>(acc, lo, scale, min, x, 8 * b + 2 * c);
            let (sc, m) = k_scale_min(scales, 2 * c + 1);
            let (scale, min) = (_mm256_set1_ps(d * f32::from(sc)), -(dmin * f32::from(m)));
            group::<D, R, false, 1>(acc, hi, scale, min, x, 8 * b + 2 * c + 1);
        }
    }
}

/// Q6_K super-block `b` (groups `8b..8b + 8`).
#[inline(always)]
unsafe fn block_q6k<D: Dot, const R: usize>(acc: &mut Acc<R>, p: *const u8, x: &Tile<R>, b: usize) {
    // SAFETY: `p` addresses one whole Q6_K block.
    unsafe {
        let d = f16(p.add(208));
        let sc = p.add(192) as *const i8;
        let (m4, m6, off) = (
            _mm256_set1_epi8(0x0f),
            _mm256_set1_epi8(0x30),
            _mm256_set1_epi8(32),
        );
        for n in 0..2 {
            let la = _mm256_loadu_si256(p.add(64 * n) as *const __m256i);
            let lb = _mm256_loadu_si256(p.add(64 * n + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(p.add(128 + 32 * n) as *const __m256i);
            let parts = [
                _mm256_or_si256(
                    _mm256_and_si256(la, m4),
                    _mm256_and_si256(_mm256_slli_epi16(qh, 4), m6),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(lb, m4),
                    _mm256_and_si256(_mm256_slli_epi16(qh, 2), m6),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(la, 4), m4),
                    _mm256_and_si256(qh, m6),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(lb, 4), m4),
                    _mm256_and_si256(_mm256_srli_epi16(qh, 2), m6),
                ),
            ];
            let sc = sc.add(8 * n);
            let g = 8 * b + 4 * n;
            let [p0, p1, p2, p3] = parts;
            group::<D, R, true, 0>(acc, _mm256_sub_epi8(p0, off), q6k_scale(d, sc), 0.0, x, g);
            let (w, scale) = (_mm256_sub_epi8(p1, off), q6k_scale(d, sc.add(2)));
            group::<D, R, true, 1>(acc, w, scale, 0.0, x, g + 1);
            let (w, scale) = (_mm256_sub_epi8(p2, off), q6k_scale(d, sc.add(4)));
            group::<D, R, true, 0>(acc, w, scale, 0.0, x, g + 2);
            let (w, scale) = (_mm256_sub_epi8(p3, off), q6k_scale(d, sc.add(6)));
            group::<D, R, true, 1>(acc, w, scale, 0.0, x, g + 3);
        }
    }
}

/// Q6_K's per-lane scale of a group: `d * sc[0]` for its first 16 values (lanes 0-3 of the
/// dot product), `d * sc[1]` for the last 16.
#[inline(always)]
unsafe fn q6k_scale(d: f32, sc: *const i8) -> __m256 {
    // SAFETY: `sc` addresses two of the block's scales.
    unsafe {
        let (a, b) = (d * f32::from(*sc), d * f32::from(*sc.add(1)));
        _mm256_set_m128(_mm_set1_ps(b), _mm_set1_ps(a))
    }
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    // SAFETY: AVX only.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

/// Weight row `w` (`num_blocks` blocks of `ty`) against the tile's `R` rows.
#[inline(always)]
unsafe fn row<D: Dot, const R: usize>(
    ty: BlockType,
    w: *const u8,
    num_blocks: usize,
    x: &Tile<R>,
) -> [f32; R] {
    // SAFETY: `w` addresses `num_blocks` blocks; the tile's rows hold as many values.
    unsafe {
        let mut acc = Acc::<R> {
            v: [[_mm256_setzero_ps(); R]; 2],
            min: [[0.0; R]; 2],
            min8: [_mm256_setzero_ps(); R],
        };
        let size = ty.block_bytes();
        // Plain loops, no closures: a closure or iterator adaptor LLVM declines to inline is
        // compiled without the caller's target features, every intrinsic in it then a call
        // (Q4_K ran 25x slower in the wheel's build than in a benchmark's).
        match ty {
            BlockType::Q4_K => {
                for b in 0..num_blocks {
                    block_q45k::<D, R>(false, &mut acc, w.add(b * size), x, b);
                }
            }
            BlockType::Q5_K => {
                for b in 0..num_blocks {
                    block_q45k::<D, R>(true, &mut acc, w.add(b * size), x, b);
                }
            }
            BlockType::Q6_K => {
                for b in 0..num_blocks {
                    block_q6k::<D, R>(&mut acc, w.add(b * size), x, b);
                }
            }
            // Each arm passes its type as a constant, which the inlined loop specializes on.
            BlockType::Q8_0 => blocks_32::<D, R, true>(BlockType::Q8_0, &mut acc, w, num_blocks, x),
            BlockType::Q4_0 => {
                blocks_32::<D, R, false>(BlockType::Q4_0, &mut acc, w, num_blocks, x)
            }
            BlockType::Q4_1 => {
                blocks_32::<D, R, false>(BlockType::Q4_1, &mut acc, w, num_blocks, x)
            }
            BlockType::Q5_0 => {
                blocks_32::<D, R, false>(BlockType::Q5_0, &mut acc, w, num_blocks, x)
            }
            BlockType::Q5_1 => {
                blocks_32::<D, R, false>(BlockType::Q5_1, &mut acc, w, num_blocks, x)
            }
        }
        let mut out = [0f32; R];
        for (r, o) in out.iter_mut().enumerate() {
            let v = _mm256_add_ps(_mm256_add_ps(acc.v[0][r], acc.v[1][r]), acc.min8[r]);
            *o = hsum(v) + acc.min[0][r] + acc.min[1][r];
        }
        out
    }
}

/// The scales of 8 consecutive blocks of `size` bytes from `p` and the float16 after each
/// (Q4_1/Q5_1's min): one gather and two conversions instead of 16 scalar ones, which were
/// half of a block's instructions at one activation row.
#[inline(always)]
unsafe fn scales8(p: *const u8, size: usize) -> (__m256, __m256) {
    let s = size as i32;
    // SAFETY: AVX2 and F16C; each of the 8 blocks starts with 4 readable bytes.
    unsafe {
        let index = _mm256_setr_epi32(0, s, 2 * s, 3 * s, 4 * s, 5 * s, 6 * s, 7 * s);
        let both = _mm256_i32gather_epi32::<1>(p as *const i32, index);
        // Per 128-bit lane: the 4 low halves (d), then the 4 high ones (m).
        let split = _mm256_setr_epi8(
            0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3,
            6, 7, 10, 11, 14, 15,
        );
        // Quadwords (d0-3, m0-3, d4-7, m4-7) -> (d0-3, d4-7, m0-3, m4-7).
        let halves = _mm256_permute4x64_epi64::<0xd8>(_mm256_shuffle_epi8(both, split));
        (
            _mm256_cvtph_ps(_mm256_castsi256_si128(halves)),
            _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(halves)),
        )
    }
}

/// A 32-value block's weights as 32 bytes: unsigned for Q4_0..Q5_1 (the offset is their min),
/// signed for Q8_0.
#[inline(always)]
unsafe fn unpack_32(ty: BlockType, p: *const u8) -> __m256i {
    // SAFETY: `p` addresses one whole block of `ty`.
    unsafe {
        match ty {
            BlockType::Q4_0 => nibbles_128(p.add(2)),
            BlockType::Q4_1 => nibbles_128(p.add(4)),
            BlockType::Q5_0 | BlockType::Q5_1 => {
                let rest = p.add(if ty == BlockType::Q5_0 { 2 } else { 4 });
                let qh = u32::from_le(std::ptr::read_unaligned(rest as *const u32));
                _mm256_or_si256(nibbles_128(rest.add(4)), fifth_bits(qh))
            }
            _ => _mm256_loadu_si256(p.add(2) as *const __m256i), // Q8_0
        }
    }
}

/// Block `j` of a chunk of 8 whose per-row scales (weight x activation) are `sc`.
#[inline(always)]
unsafe fn chunk_block<D: Dot, const R: usize, const SIGNED: bool, const SET: usize>(
    acc: &mut Acc<R>,
    w: __m256i,
    sc: &[[f32; 8]; R],
    j: usize,
    x: &Tile<R>,
    g: usize,
) {
    // SAFETY: the tile's rows hold group `g`.
    unsafe {
        let wu = if SIGNED { _mm256_sign_epi8(w, w) } else { w };
        for r in 0..R {
            let xq = _mm256_loadu_si256(x.q[r].add(g * GROUP) as *const __m256i);
            let xs = if SIGNED { _mm256_sign_epi8(xq, w) } else { xq };
            let p = _mm256_cvtepi32_ps(D::dot(wu, xs));
            let scale = _mm256_broadcast_ss(&sc[r][j]);
            acc.v[SET][r] = _mm256_fmadd_ps(p, scale, acc.v[SET][r]);
        }
    }
}

/// Every block of a 32-value type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): whole chunks of 8 with their
/// scales converted together and the min terms as one vector multiply-add per chunk, the
/// remainder one by one; even blocks into sums 0, odd ones into sums 1.
#[inline(always)]
unsafe fn blocks_32<D: Dot, const R: usize, const SIGNED: bool>(
    ty: BlockType,
    acc: &mut Acc<R>,
    w: *const u8,
    num_blocks: usize,
    x: &Tile<R>,
) {
    let size = ty.block_bytes();
    let mut b = 0;
    // SAFETY: `w` addresses `num_blocks` blocks; the tile's rows hold as many groups.
    unsafe {
        while b + 8 <= num_blocks {
            let p = w.add(b * size);
            let (d, m) = scales8(p, size);
            let min = match ty {
                BlockType::Q4_0 => _mm256_mul_ps(d, _mm256_set1_ps(-8.0)),
                BlockType::Q5_0 => _mm256_mul_ps(d, _mm256_set1_ps(-16.0)),
                _ => m,
            };
            let mut sc = [[0f32; 8]; R];
            for r in 0..R {
                let xd = _mm256_loadu_ps(x.d[r].add(b));
                _mm256_storeu_ps(sc[r].as_mut_ptr(), _mm256_mul_ps(d, xd));
                if !SIGNED {
                    let xs = _mm256_loadu_ps(x.s[r].add(b));
                    acc.min8[r] = _mm256_fmadd_ps(min, xs, acc.min8[r]);
                }
            }
            let mut j = 0;
            while j < 8 {
                let w0 = unpack_32(ty, p.add(j * size));
                chunk_block::<D, R, SIGNED, 0>(acc, w0, &sc, j, x, b + j);
                let w1 = unpack_32(ty, p.add((j + 1) * size));
                chunk_block::<D, R, SIGNED, 1>(acc, w1, &sc, j + 1, x, b + j + 1);
                j += 2;
            }
            b += 8;
        }
        while b < num_blocks {
            if SIGNED {
                block_q8_0::<D, R, 0>(acc, w.add(b * size), x, b);
            } else {
                block_32::<D, R, 0>(ty, acc, w.add(b * size), x, b);
            }
            b += 1;
        }
    }
}

/// Products of every weight row of `work` with every activation row, stored as `X`.
#[inline(always)]
unsafe fn tile_rows<D: Dot, X: Elem>(work: &Work<'_, X>) {
    let num_blocks = work.row_bytes / work.ty.block_bytes();
    let m = work.x.m;
    for (n, wrow) in work.w.chunks_exact(work.row_bytes).enumerate() {
        let w = wrow.as_ptr();
        let mut r = 0;
        while r < m {
            let take = (m - r).min(MAX_TILE);
            // SAFETY: `w` is one whole row; the activation rows have `num_blocks` blocks of
            // values and `out` room for every (row, column) (the caller's contract).
            unsafe {
                match take {
                    4 => work.store(
                        r,
                        n,
                        row::<D, 4>(work.ty, w, num_blocks, &Tile::new(work.x, r)),
                    ),
                    3 => work.store(
                        r,
                        n,
                        row::<D, 3>(work.ty, w, num_blocks, &Tile::new(work.x, r)),
                    ),
                    2 => work.store(
                        r,
                        n,
                        row::<D, 2>(work.ty, w, num_blocks, &Tile::new(work.x, r)),
                    ),
                    _ => work.store(
                        r,
                        n,
                        row::<D, 1>(work.ty, w, num_blocks, &Tile::new(work.x, r)),
                    ),
                }
            }
            r += take;
        }
    }
}

/// One row `x` quantized into `(q, d, s)` exactly as `act::quantize_row` does (the same
/// scale, the same products by its inverse, rounding to nearest even), eight lanes at a time:
/// LLVM leaves the scalar loop unvectorized (the float-to-`i8` casts saturate), and at a few
/// rows that loop outweighed the matmul itself.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `x.len()` is `q.len()`, `32 * d.len()` and `32 * s.len()`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn quantize_row_avx2<X: Elem>(x: &[X], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let mut v = [0f32; GROUP];
    for (g, xg) in x.chunks_exact(GROUP).enumerate() {
        for (a, b) in v.iter_mut().zip(xg) {
            *a = b.to_f32();
        }
        // SAFETY: AVX2 (this function's features); `v` holds 32 values and `q` has group `g`.
        unsafe {
            let (scale, sum) = quantize_group(&v, q.as_mut_ptr().add(g * GROUP));
            d[g] = scale;
            s[g] = scale * sum as f32;
        }
    }
}

/// 32 values into 32 `i8` at `q`; their scale and the integers' sum.
#[inline(always)]
unsafe fn quantize_group(v: &[f32; GROUP], q: *mut i8) -> (f32, i32) {
    // SAFETY: AVX2 (the caller's features); `q` addresses 32 writable bytes.
    unsafe {
        let lanes = [0, 8, 16, 24].map(|i| _mm256_loadu_ps(v.as_ptr().add(i)));
        let sign = _mm256_set1_ps(-0.0);
        let abs = lanes.map(|l| _mm256_andnot_ps(sign, l));
        let m = _mm256_max_ps(_mm256_max_ps(abs[0], abs[1]), _mm256_max_ps(abs[2], abs[3]));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        let scale = amax / 127.0;
        let inv = _mm256_set1_ps(if amax > 0.0 { 127.0 / amax } else { 0.0 });
        // Round to nearest even (the default MXCSR mode), as `act::round`.
        let ints = lanes.map(|l| _mm256_cvtps_epi32(_mm256_mul_ps(l, inv)));
        let total = _mm256_add_epi32(
            _mm256_add_epi32(ints[0], ints[1]),
            _mm256_add_epi32(ints[2], ints[3]),
        );
        let t = _mm_add_epi32(
            _mm256_castsi256_si128(total),
            _mm256_extracti128_si256::<1>(total),
        );
        let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0x4e>(t));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32::<0xb1>(t)));
        // The packs work per 128-bit lane: dwords come out as 0,4,1,5,2,6,3,7 of the order.
        let words = _mm256_packs_epi16(
            _mm256_packs_epi32(ints[0], ints[1]),
            _mm256_packs_epi32(ints[2], ints[3]),
        );
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        _mm256_storeu_si256(q as *mut __m256i, _mm256_permutevar8x32_epi32(words, order));
        (scale, sum)
    }
}

/// The AVX2 kernel (`maddubs`).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `work` must satisfy `Work`'s contract.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_avx2<X: Elem>(work: &Work<'_, X>) {
    // SAFETY: as this function's contract.
    unsafe { tile_rows::<Maddubs, X>(work) }
}

/// `tile_avx2` over interleaved weights (`interleave`).
///
/// # Safety
/// As `tile_avx2`; `work` holds whole interleaved runs of a type `interleave::packs`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn interleaved_avx2<X: Elem>(work: &Work<'_, X>) {
    // SAFETY: as this function's contract.
    unsafe { super::x86_x8::interleaved::<Maddubs, X>(work) }
}

/// `tile_avxvnni` over interleaved weights.
///
/// # Safety
/// As `interleaved_avx2`, and the CPU must have AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub unsafe fn interleaved_avxvnni<X: Elem>(work: &Work<'_, X>) {
    // SAFETY: as this function's contract.
    unsafe { super::x86_x8::interleaved::<AvxVnni, X>(work) }
}

/// `tile_avx512vnni` over interleaved weights: at 512 bits (`x86_x16`) where the CPU has
/// AVX512BW too (every AVX512-VNNI CPU made so far), else at 256.
///
/// # Safety
/// As `interleaved_avx2`, and the CPU must have AVX512F, AVX512VL and AVX512-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub unsafe fn interleaved_avx512vnni<X: Elem>(work: &Work<'_, X>) {
    // Read once: this runs for every matmul job, and `has` searches the feature names.
    static AVX512BW: OnceLock<bool> = OnceLock::new();
    if *AVX512BW.get_or_init(|| CpuFeatures::get().has("avx512bw")) {
        // SAFETY: as this function's contract, and AVX512BW was just checked.
        return unsafe { interleaved_avx512vnni_512(work) };
    }
    // SAFETY: as this function's contract.
    unsafe { super::x86_x8::interleaved::<Avx512Vnni, X>(work) }
}

/// `interleaved_avx512vnni` at 512 bits.
///
/// # Safety
/// As `interleaved_avx512vnni`, and the CPU must have AVX512BW.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn interleaved_avx512vnni_512<X: Elem>(work: &Work<'_, X>) {
    // SAFETY: as this function's contract.
    unsafe { super::x86_x16::interleaved::<X>(work) }
}

/// The AVX-VNNI kernel: as `tile_avx2`, and the CPU must have AVX-VNNI.
///
/// # Safety
/// See `tile_avx2`.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub unsafe fn tile_avxvnni<X: Elem>(work: &Work<'_, X>) {
    // SAFETY: as this function's contract.
    unsafe { tile_rows::<AvxVnni, X>(work) }
}

/// The AVX512-VNNI kernel (at 256 bits): as `tile_avx2`, and the CPU must have AVX512F,
/// AVX512VL and AVX512-VNNI.
///
/// # Safety
/// See `tile_avx2`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub unsafe fn tile_avx512vnni<X: Elem>(work: &Work<'_, X>) {
    // SAFETY: as this function's contract.
    unsafe { tile_rows::<Avx512Vnni, X>(work) }
}
