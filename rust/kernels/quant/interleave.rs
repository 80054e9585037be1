//! Weights repacked eight rows at a time, so one activation group meets eight weight rows in
//! each instruction: the layout the x86 kernels of `x86_x8` read (llama.cpp repacks Q4_0 the
//! same way for its AVX2 GEMV).
//!
//! For each run of 8 rows and each block column `b`, the 8 blocks `b` of those rows become:
//! their 8 float16 scales `d` (16 bytes), Q4_1's and Q5_1's 8 float16 mins (16 bytes), Q5_0's
//! and Q5_1's 8 words of fifth bits (32 bytes, row `r`'s in bytes `4r..4r + 4`), then the
//! integers in chunks of 32 bytes, each 4 bytes of every row in row order: chunk `c` holds
//! bytes `4c..4c + 4` of each row's integers. For the nibble formats (Q4_0..Q5_1), byte `j`
//! holds values `j` (low nibble) and `j + 16` (high), so chunk `c` is values `4c..4c + 4` and
//! `16 + 4c..16 + 4c + 4` of all 8 rows; Q8_0's chunk `c` is values `4c..4c + 4`. A dot product
//! of 4 bytes per 32-bit lane (`maddubs` + `madd`, or `dpbusd`) against the activation's 4
//! values broadcast to every lane then leaves row `r`'s partial sum in lane `r`: no horizontal
//! sums, one scale vector per block column. The fifth bits sit one row per lane too, so one
//! byte shuffle spreads a chunk's bits over its bytes. The repacked rows take exactly the bytes
//! of the original ones.

use super::blocks::BlockType;

/// Rows per interleaved run.
pub const ROWS: usize = 8;

/// Whether `ty` has an interleaved layout.
pub fn packs(ty: BlockType) -> bool {
    matches!(
        ty,
        BlockType::Q4_0 | BlockType::Q4_1 | BlockType::Q5_0 | BlockType::Q5_1 | BlockType::Q8_0
    )
}

/// Whether `rows` rows of `ty` can be interleaved: a `packs` type in whole runs.
pub fn fits(ty: BlockType, rows: usize) -> bool {
    packs(ty) && rows.is_multiple_of(ROWS)
}

/// Float16 fields of a block: the scale, and the min where the type has one.
pub fn halves(ty: BlockType) -> usize {
    if matches!(ty, BlockType::Q4_1 | BlockType::Q5_1) {
        2
    } else {
        1
    }
}

/// Bytes of fifth bits in a block (Q5_0 and Q5_1's 32-bit word).
pub fn high_bytes(ty: BlockType) -> usize {
    if matches!(ty, BlockType::Q5_0 | BlockType::Q5_1) {
        4
    } else {
        0
    }
}

/// Bytes before a block column's integers: the scales, the mins and the fifth bits.
pub fn header_bytes(ty: BlockType) -> usize {
    block_header(ty) * ROWS
}

/// Bytes of a block before its integers.
fn block_header(ty: BlockType) -> usize {
    2 * halves(ty) + high_bytes(ty)
}

/// `data` (rows of `row_bytes`, a multiple of 8 of them, blocks of a `packs` type) in the
/// interleaved layout.
pub fn pack(ty: BlockType, data: &[u8], row_bytes: usize) -> Vec<u8> {
    let mut out = vec![0u8; data.len()];
    for (rows, run) in data
        .chunks_exact(ROWS * row_bytes)
        .zip(out.chunks_exact_mut(ROWS * row_bytes))
    {
        for (row, at, packed, len) in moves(ty, row_bytes) {
            run[packed..][..len].copy_from_slice(&rows[row * row_bytes + at..][..len]);
        }
    }
    out
}

/// The interleaved `data` back in rows (`pack`'s inverse).
pub fn unpack(ty: BlockType, data: &[u8], row_bytes: usize) -> Vec<u8> {
    let mut out = vec![0u8; data.len()];
    for (run, rows) in data
        .chunks_exact(ROWS * row_bytes)
        .zip(out.chunks_exact_mut(ROWS * row_bytes))
    {
        for (row, at, packed, len) in moves(ty, row_bytes) {
            rows[row * row_bytes + at..][..len].copy_from_slice(&run[packed..][..len]);
        }
    }
    out
}

/// Every `(row, byte in that row, byte in the packed run, length)` move of one run of 8 rows.
fn moves(ty: BlockType, row_bytes: usize) -> impl Iterator<Item = (usize, usize, usize, usize)> {
    let size = ty.block_bytes();
    let head = block_header(ty);
    let ints = size - head;
    (0..row_bytes / size).flat_map(move |b| {
        let (at, column) = (b * size, b * ROWS * size);
        (0..ROWS).flat_map(move |row| {
            // Field `f` (scale, min) of row `row` goes to float16 slot `f * 8 + row`, its
            // fifth bits to word `row` after them.
            let n = halves(ty);
            let fields = (0..n).map(move |f| (row, at + 2 * f, column + 2 * (f * ROWS + row), 2));
            let high = (high_bytes(ty) > 0).then_some((
                row,
                at + 2 * n,
                column + 2 * n * ROWS + 4 * row,
                4,
            ));
            let chunks = (0..ints / 4).map(move |c| {
                (
                    row,
                    at + head + 4 * c,
                    column + head * ROWS + 32 * c + 4 * row,
                    4,
                )
            });
            fields.chain(high).chain(chunks)
        })
    })
}
