//! GGUF's block formats, as ggml lays them out in a file, and their portable decoding.
//!
//! Every format stores a row of `k` values as `k / VALUES` consecutive blocks. Each block is
//! read here as groups of 32 values: `w[j] = q[j] * scale[j / 16] + min`, `q` a small integer
//! (`i8`), with two half-group scales (equal except in Q6_K, whose scales cover 16 values) and
//! an additive `min` (0 for the symmetric formats). The integer kernels consume exactly this
//! form, so the products they compute are the products of the file's own dequantized weights.
//!
//! | type | values | bytes | layout                                               |
//! |------|--------|-------|------------------------------------------------------|
//! | Q4_0 | 32     | 18    | d f16, 16 nibble bytes; `w = d * (q - 8)`            |
//! | Q4_1 | 32     | 20    | d, m f16, 16 nibble bytes; `w = d * q + m`           |
//! | Q5_0 | 32     | 22    | d, 4 bytes of 5th bits, 16 nibble bytes; `d * (q - 16)` |
//! | Q5_1 | 32     | 24    | d, m, 4 bytes of 5th bits, 16 nibble bytes; `d * q + m` |
//! | Q8_0 | 32     | 34    | d, 32 i8; `w = d * q`                                |
//! | Q4_K | 256    | 144   | d, dmin, 12 bytes of 6-bit (scale, min) x 8, 128 nibble bytes |
//! | Q5_K | 256    | 176   | as Q4_K, plus 32 bytes of 5th bits before the nibbles |
//! | Q6_K | 256    | 210   | 128 low-nibble bytes, 64 bytes of 2-bit highs, 16 i8 scales, d |
//!
//! In the 32-value formats byte `j` of the nibbles holds value `j` (low half) and `j + 16`
//! (high half), and bit `j` of the 5th bits belongs to value `j`. In Q4_K/Q5_K each 32 nibble
//! bytes hold two groups (low halves, then high halves), with (scale, min) pairs `j < 4` in the
//! low 6 bits of `scales[j]`, `scales[j + 4]` and the others split across the nibbles of
//! `scales[j + 4]` and the top 2 bits of `scales[j - 4]` (scale) and `scales[j]` (min).

use crate::error::{CoreError, CoreResult};

/// A block format the kernels read (ggml's `GGMLQuantizationType` ids in `from_ggml`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum BlockType {
    /// 4-bit, one scale per 32 values, offset 8.
    Q4_0,
    /// 4-bit, scale and min per 32 values.
    Q4_1,
    /// 5-bit, one scale per 32 values, offset 16.
    Q5_0,
    /// 5-bit, scale and min per 32 values.
    Q5_1,
    /// 8-bit, one scale per 32 values.
    Q8_0,
    /// 4-bit super-blocks of 256: 6-bit scale and min per 32 values.
    Q4_K,
    /// 5-bit super-blocks of 256: 6-bit scale and min per 32 values.
    Q5_K,
    /// 6-bit super-blocks of 256: 8-bit scale per 16 values, offset 32.
    Q6_K,
}

/// Every type, for tests and for listing.
pub const ALL_TYPES: [BlockType; 8] = [
    BlockType::Q4_0,
    BlockType::Q4_1,
    BlockType::Q5_0,
    BlockType::Q5_1,
    BlockType::Q8_0,
    BlockType::Q4_K,
    BlockType::Q5_K,
    BlockType::Q6_K,
];

/// Values in one group: the unit the activations are quantized in and the kernels step by.
pub const GROUP: usize = 32;

impl BlockType {
    /// The type of ggml type id `id`, if the kernels read it.
    pub fn from_ggml(id: u32) -> Option<Self> {
        Some(match id {
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            _ => return None,
        })
    }

    /// ggml's id of this type.
    pub fn ggml_id(self) -> u32 {
        match self {
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
        }
    }

    /// ggml's name ("Q4_K").
    pub fn name(self) -> &'static str {
        match self {
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
        }
    }

    /// Values per block.
    pub fn block_values(self) -> usize {
        match self {
            Self::Q4_K | Self::Q5_K | Self::Q6_K => 256,
            _ => 32,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q4_K => 144,
            Self::Q5_K => 176,
            Self::Q6_K => 210,
        }
    }

    /// Bytes of a row of `k` values; an error naming `param` unless `k` is a positive multiple
    /// of the block.
    pub fn row_bytes(self, k: usize, param: &str) -> CoreResult<usize> {
        let values = self.block_values();
        if k == 0 || !k.is_multiple_of(values) {
            return Err(CoreError::invalid(
                param,
                "invalid_quantized_input",
                format!(
                    "`{param}` ({k}) must be a positive multiple of {}'s {values}-value blocks",
                    self.name()
                ),
            ));
        }
        Ok(k / values * self.block_bytes())
    }
}

/// One group of 32 values: `w[j] = q[j] * scale[j / 16] + min`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Group {
    /// The integers: 0..=31 in the types with a min (and Q4_0/Q5_0, whose offset is the min),
    /// -128..=127 in Q8_0, -32..=31 in Q6_K.
    pub q: [i8; GROUP],
    /// The scale of values 0..16 and of values 16..32.
    pub scale: [f32; 2],
    /// Added to every value.
    pub min: f32,
}

/// `bits` (IEEE half precision) as float32, exactly, in integer and scalar float operations
/// only: the SIMD kernels use it too, because LLVM turns a one-lane `vcvtph2ps` into a 16-bit
/// insert into whatever register held the previous block's scale, chaining every block to the
/// last (3x slower at one activation row).
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    let h = u32::from(bits);
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    let magnitude = if em >= 0x7c00 {
        0x7f80_0000 | ((em & 0x3ff) << 13) // infinity or NaN
    } else if em >= 0x0400 {
        (em << 13) + (112 << 23) // normal: rebias the exponent
    } else {
        // Subnormal (or zero): man * 2^-24, a normal float32 (no subnormal operand, which
        // would cost a microcode assist).
        (em as f32 * f32::from_bits(0x3380_0000)).to_bits()
    };
    f32::from_bits(magnitude | sign)
}

#[inline(always)]
pub(crate) fn half_at(block: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([block[at], block[at + 1]]))
}

/// Q4_K/Q5_K's (scale, min) pair `j` (0..8) from the 12 packed bytes.
#[inline(always)]
pub(crate) fn k_scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// Decodes one block of `ty` into its `block_values / 32` groups (`out` holds at least that).
pub fn decode_block(ty: BlockType, block: &[u8], out: &mut [Group]) {
    let block = &block[..ty.block_bytes()];
    match ty {
        BlockType::Q4_0 | BlockType::Q4_1 => {
            let d = half_at(block, 0);
            let (min, qs) = if ty == BlockType::Q4_0 {
                (-8.0 * d, &block[2..18])
            } else {
                (half_at(block, 2), &block[4..20])
            };
            let g = &mut out[0];
            for (j, &byte) in qs.iter().enumerate() {
                g.q[j] = (byte & 0x0f) as i8;
                g.q[j + 16] = (byte >> 4) as i8;
            }
            (g.scale, g.min) = ([d; 2], min);
        }
        BlockType::Q5_0 | BlockType::Q5_1 => {
            let d = half_at(block, 0);
            let (min, rest) = if ty == BlockType::Q5_0 {
                (-16.0 * d, &block[2..22])
            } else {
                (half_at(block, 2), &block[4..24])
            };
            let qh = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
            let qs = &rest[4..20];
            let g = &mut out[0];
            let hi = |bit: usize| (((qh >> bit) & 1) << 4) as u8;
            for (j, &byte) in qs.iter().enumerate() {
                g.q[j] = ((byte & 0x0f) | hi(j)) as i8;
                g.q[j + 16] = ((byte >> 4) | hi(j + 16)) as i8;
            }
            (g.scale, g.min) = ([d; 2], min);
        }
        BlockType::Q8_0 => {
            let d = half_at(block, 0);
            let g = &mut out[0];
            for (q, &b) in g.q.iter_mut().zip(&block[2..34]) {
                *q = b as i8;
            }
            (g.scale, g.min) = ([d; 2], 0.0);
        }
        BlockType::Q4_K | BlockType::Q5_K => decode_q45k(ty, block, out),
        BlockType::Q6_K => decode_q6k(block, out),
    }
}

fn decode_q45k(ty: BlockType, block: &[u8], out: &mut [Group]) {
    let (d, dmin) = (half_at(block, 0), half_at(block, 2));
    let scales = &block[4..16];
    let (qh, qs) = if ty == BlockType::Q5_K {
        (Some(&block[16..48]), &block[48..176])
    } else {
        (None, &block[16..144])
    };
    for c in 0..4 {
        let ql = &qs[32 * c..32 * c + 32];
        for half in 0..2 {
            let j = 2 * c + half;
            let (sc, m) = k_scale_min(scales, j);
            let g = &mut out[j];
            for l in 0..32 {
                let nibble = if half == 0 { ql[l] & 0x0f } else { ql[l] >> 4 };
                let high = qh.map_or(0, |qh| ((qh[l] >> j) & 1) << 4);
                g.q[l] = (nibble | high) as i8;
            }
            g.scale = [d * f32::from(sc); 2];
            g.min = -(dmin * f32::from(m));
        }
    }
}

fn decode_q6k(block: &[u8], out: &mut [Group]) {
    let (ql, qh) = (&block[0..128], &block[128..192]);
    let sc = &block[192..208];
    let d = half_at(block, 208);
    for n in 0..2 {
        let (ql, qh, sc) = (&ql[64 * n..], &qh[32 * n..], &sc[8 * n..]);
        for part in 0..4 {
            let g = &mut out[4 * n + part];
            for l in 0..32 {
                let low = ql[l + 32 * (part & 1)];
                let nibble = if part < 2 { low & 0x0f } else { low >> 4 };
                let high = (qh[l] >> (2 * part)) & 3;
                g.q[l] = (nibble | (high << 4)) as i8 - 32;
            }
            let scale = |i: usize| d * f32::from(sc[2 * part + i] as i8);
            g.scale = [scale(0), scale(1)];
            g.min = 0.0;
        }
    }
}

/// Row `bytes` (whole blocks of `ty`) dequantized into `out` (its length: the row's values).
pub fn dequantize_row(ty: BlockType, bytes: &[u8], out: &mut [f32]) {
    let mut groups = [Group::default(); 8];
    for (block, values) in bytes
        .chunks_exact(ty.block_bytes())
        .zip(out.chunks_exact_mut(ty.block_values()))
    {
        decode_block(ty, block, &mut groups);
        for (g, vals) in groups.iter().zip(values.chunks_exact_mut(GROUP)) {
            for (j, v) in vals.iter_mut().enumerate() {
                *v = f32::from(g.q[j]) * g.scale[j / 16] + g.min;
            }
        }
    }
}
