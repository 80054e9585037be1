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
//! Layout: `core` is the scheduler proper (sequences, groups, budget, admission, preemption,
//! blocks), and knows no behaviour by name; `behaviour` holds what requests do at its edges
//! (how a request samples, ranks or searches, drafts, grammar masks), one file each; `prefill` is the prefill-only scheduler of embedding models, a small one of its own.
//! Leaves they share: `rank` (order) <- `queue`; `seq` (sequences and groups), `request` (the
//! typed request and the checks every scheduler makes), `text` (detokenizer and stop strings),
//! `plan` and `output` (the step's columns), `stats`, `config`, `media` (media spans: their
//! block-hash keys and encoder work).

mod behaviour;
mod config;
mod core;
mod endings;
mod media;
mod output;
mod plan;
mod prefill;
mod queue;
mod rank;
mod request;
mod seq;
mod slab;
mod stats;
mod text;

pub use self::core::Scheduler;
pub use behaviour::propose_ngram;
pub use config::{NgramConfig, SchedulerConfig};
pub use media::MediaSpan;
pub use output::StepOutput;
pub use plan::StepPlan;
pub use prefill::PrefillScheduler;
pub use request::NewRequest;
pub use stats::{SchedulerStats, SeqView};

#[cfg(test)]
mod tests;
