//! The portable kernel, and the reference the SIMD kernels are tested against: each weight
//! block decoded into its groups (`blocks::decode_block`) once, then integer dot products of
//! each group's halves with every activation row of the tile, one float multiply per half.

use super::act::QuantizedRows;
use super::blocks::{decode_block, BlockType, Group, GROUP};

/// Products of weight row `w` (whole blocks of `ty`) with activation rows `rows` of `x`,
/// into `out[i]` for `rows[i]`.
pub fn dot_rows(ty: BlockType, w: &[u8], x: &QuantizedRows, rows: &[usize], out: &mut [f32]) {
    let mut groups = [Group::default(); 8];
    let per_block = ty.block_values() / GROUP;
    out.fill(0.0);
    for (b, block) in w.chunks_exact(ty.block_bytes()).enumerate() {
        decode_block(ty, block, &mut groups);
        for (o, &r) in out.iter_mut().zip(rows) {
            let (q, d, s) = x.row(r);
            for (i, g) in groups[..per_block].iter().enumerate() {
                let at = b * per_block + i;
                *o += group_dot(g, &q[at * GROUP..][..GROUP], d[at], s[at]);
            }
        }
    }
}

/// One group's product with one activation group (`xq * xd`, summing to `xs`).
#[inline(always)]
fn group_dot(g: &Group, xq: &[i8], xd: f32, xs: f32) -> f32 {
    let half = |h: usize| -> i32 {
        (h * 16..h * 16 + 16)
            .map(|j| i32::from(g.q[j]) * i32::from(xq[j]))
            .sum()
    };
    xd * (g.scale[0] * half(0) as f32 + g.scale[1] * half(1) as f32) + g.min * xs
}
