//! The scheduler: continuous batching with one token budget per step over paged KV blocks.
//!
//! There are no prefill or decode phases. Every sequence has `num_computed_tokens` and a token
//! list (prompt + output); each step spends `max_num_batched_tokens` on running sequences first
//! (a decode costs 1 token, an unfinished prefill continues with a chunk), then admits waiting
//! sequences in (effective priority, arrival) order.
//!
//! Priority aging: a request's effective priority is its priority (1 highest .. 5) improved by
//! one level per `priority_aging_s` seconds since its arrival, never better than 1. Admission,
//! preemption and the order of running work all use it, so a low-priority request that waits
//! long enough ranks with priority 1 and can no longer be passed over or preempted by newer
//! work: nothing is starved forever.
//!
//! Preemption is by recompute: the victim (worst effective priority, then latest arrival) frees
//! its blocks and goes back to the front of its priority's queue; when re-admitted it recomputes
//! prompt + output so far, usually from the prefix cache.

//!
//! Modules depend one way: `rank` (order) <- `queue`, `request` <- `text`; `plan` (the step's
//! columns) stands alone; the `Scheduler` is split by concept over `scheduler` (state, queries),
//! `intake`, `schedule`, `preempt`, `finish` and `update`, which use the modules above.

mod beam;
mod config;
mod finish;
mod intake;
mod invariants;
mod plan;
mod preempt;
mod prefill;
mod queue;
mod rank;
mod request;
mod schedule;
mod scheduler;
mod text;
mod update;

pub use config::SchedulerConfig;
pub use intake::NewRequest;
pub use plan::{StepOutput, StepPlan};
pub use scheduler::{Scheduler, SchedulerStats, SeqView};

#[cfg(test)]
mod tests;
