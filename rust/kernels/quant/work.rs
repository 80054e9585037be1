//! One kernel call's work: a run of whole weight rows of one type against every activation
//! row, and where the products go.

use super::act::QuantizedRows;
use super::blocks::BlockType;
use crate::kernels::simd::Elem;

/// Weight rows `w` against all of `x`'s rows; product `(r, n)` (activation row `r`, weight row
/// `n` of `w`) is stored at `out[r * ld + n]`.
///
/// Contract the kernels rely on (upheld by `matmul`): `w` is whole rows of `row_bytes`, each
/// `x.k / ty.block_values()` blocks of `ty`; `out` addresses `x.m` rows of `ld` values, of
/// which columns `0..w.len() / row_bytes` are this work's and written by nothing else.
#[derive(Clone, Copy)]
pub struct Work<'a, X> {
    /// The weight type.
    pub ty: BlockType,
    /// Whole rows of `ty` blocks.
    pub w: &'a [u8],
    /// Bytes per weight row.
    pub row_bytes: usize,
    /// The quantized activations.
    pub x: &'a QuantizedRows,
    /// Column 0 of this work's outputs in activation row 0.
    pub out: *mut X,
    /// Elements from one activation row's outputs to the next.
    pub ld: usize,
    /// `w` is runs of 8 rows in `interleave`'s layout.
    pub interleaved: bool,
}

impl<X: Elem> Work<'_, X> {
    /// Stores the products of weight row `n` with activation rows `r..r + R`.
    ///
    /// # Safety
    /// `r + R <= x.m` and `n` is a row of `w` (see the struct's contract).
    #[inline(always)]
    pub unsafe fn store<const R: usize>(&self, r: usize, n: usize, values: [f32; R]) {
        for (i, v) in values.into_iter().enumerate() {
            // SAFETY: in bounds and exclusively this work's, by the contract.
            unsafe { *self.out.add((r + i) * self.ld + n) = X::from_f32(v) };
        }
    }
}
