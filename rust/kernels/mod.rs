//! CPU compute kernels over tensors the caller owns: paged attention reading the KV cache in
//! place (`attention`) and matrix products over GGUF-quantized weights read in their own blocks
//! (`quant`), at the SIMD width `cpu` detects at run time, in parallel on `pool` (the caller's OpenMP
//! team when handed one, else rayon). Plain Rust over slices; the bindings
//! in `py/attention.rs` and `py/quant.rs` turn torch tensors into those slices.

pub mod attention;
pub mod cpu;
pub mod pool;
pub mod quant;
mod simd;

pub use attention::{attend, write_kv, Dims, Rows, StepLayout};
pub use cpu::{CpuFeatures, IsaCap, KernelTier};
pub use simd::Elem;
