//! Float rows quantized into GGUF blocks, round to nearest: how a dense checkpoint served with
//! `--quantization int4|int8` gets the same kernels as a GGUF file. Scales are stored as
//! float16, as in the files, and the integers are rounded against the stored scale, so each
//! value moves by at most half a step of its block (plus, in Q4_1, the float16 rounding of
//! its min).

use half::f16;

use super::blocks::{BlockType, GROUP};
use crate::error::{CoreError, CoreResult};

/// Quantizes `x` (whole blocks of `ty`) into `out` (`ty.row_bytes(x.len())` bytes).
/// Q8_0 (`int8`): `d = max|x| / 127`. Q4_1 (`int4`): `d = (max - min) / 15`, `m = min`.
/// Other types are refused, naming `ty`.
pub fn quantize_row_into(ty: BlockType, x: &[f32], out: &mut [u8]) -> CoreResult<()> {
    let row_bytes = ty.row_bytes(x.len(), "k")?;
    if out.len() != row_bytes {
        let msg = format!("`out` must hold {row_bytes} bytes; got {}", out.len());
        return Err(CoreError::invalid("out", "invalid_quantized_input", msg));
    }
    let blocks = x
        .chunks_exact(GROUP)
        .zip(out.chunks_exact_mut(ty.block_bytes()));
    match ty {
        BlockType::Q8_0 => blocks.for_each(|(v, b)| q8_0(v, b)),
        BlockType::Q4_1 => blocks.for_each(|(v, b)| q4_1(v, b)),
        _ => {
            let msg = format!(
                "`ty` must be Q4_1 or Q8_0 to quantize to; got {}",
                ty.name()
            );
            return Err(CoreError::invalid("ty", "invalid_quantized_input", msg));
        }
    }
    Ok(())
}

/// Stores `d` as float16 at `b[0..2]` and returns the stored value's reciprocal (0 for 0).
fn put_scale(b: &mut [u8], at: usize, d: f32) -> (f32, f32) {
    let h = f16::from_f32(d);
    b[at..at + 2].copy_from_slice(&h.to_bits().to_le_bytes());
    let stored = h.to_f32();
    (stored, if stored != 0.0 { 1.0 / stored } else { 0.0 })
}

fn q8_0(v: &[f32], b: &mut [u8]) {
    let amax = v.iter().fold(0f32, |a, x| a.max(x.abs()));
    let (_, inv) = put_scale(b, 0, amax / 127.0);
    for (o, x) in b[2..34].iter_mut().zip(v) {
        *o = (x * inv).round().clamp(-127.0, 127.0) as i8 as u8;
    }
}

fn q4_1(v: &[f32], b: &mut [u8]) {
    let lo = v.iter().fold(f32::INFINITY, |a, &x| a.min(x));
    let hi = v.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
    let (_, inv) = put_scale(b, 0, (hi - lo) / 15.0);
    let (m, _) = put_scale(b, 2, lo);
    let q = |x: f32| ((x - m) * inv).round().clamp(0.0, 15.0) as u8;
    for j in 0..16 {
        b[4 + j] = q(v[j]) | (q(v[j + 16]) << 4);
    }
}
