//! ferrollm's Rust core: the scheduler (continuous batching over paged KV blocks with a prefix
//! cache), the sampler, the incremental detokenizer, the stop matcher, request validation and
//! the errors they share. Everything here is plain Rust; the Python
//! bindings live in `py/` behind the `python` feature, so `cargo test` and `cargo bench` need no
//! Python.

pub mod detok;
pub mod error;
pub mod grammar;
pub mod kernels;
pub mod kv;
pub mod params;
pub mod sampling;
pub mod sched;
pub mod stop;
pub mod types;
pub mod validate;

#[cfg(test)]
mod fuzzing;

#[cfg(feature = "python")]
mod py;

pub use error::CoreError;
pub use params::SamplingParams;
pub use sched::{NewRequest, Scheduler, SchedulerConfig, StepOutput, StepPlan};
pub use types::{BlockId, FinishReason, RequestId, TokenId};
