//! CPU compute kernels over tensors the caller owns: paged attention reading the KV cache in
//! place (`attention`), on the element math in `simd`, at the SIMD width `cpu` detects. Plain Rust over slices; the binding in
//! `py/attention.rs` turns torch tensors into those slices.

pub mod attention;
pub mod cpu;
mod simd;

pub use attention::{attend, write_kv, Dims, Rows, StepLayout};
pub use cpu::{CpuFeatures, IsaCap, KernelTier};
pub use simd::Elem;
