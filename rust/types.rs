//! Identifier newtypes and the small enums shared by every module.

/// A token id. A plain alias rather than a newtype: token arrays cross to numpy as raw integers
/// and are hashed as bytes, and a wrapper would force a copy at both places.
pub type TokenId = u32;

/// The caller's id for a request; unique among unfinished requests.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// Index of a KV-cache block in the block pool. Block 0 is the null block: never allocated,
/// used to pad block tables.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

impl BlockId {
    /// The padding block; it never holds anyone's KV.
    pub const NULL: BlockId = BlockId(0);

    /// The block id as an index into per-block arrays.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Why a sequence stopped. The numeric values cross to Python (`0` means "not finished").
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FinishReason {
    /// EOS or a stop token id was sampled (after `min_tokens`).
    Stop = 1,
    /// `max_tokens` or `max_model_len` was reached.
    Length = 2,
    /// The caller aborted the request (for example the client went away).
    Abort = 3,
    /// The request's deadline passed before it finished.
    Timeout = 4,
    /// The request failed alone (for example its logits row had no finite value left after its
    /// processors); the step's other requests went on.
    Error = 5,
}

impl FinishReason {
    /// The lower-case name used by the APIs ("stop", "length", "abort", "timeout", "error").
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Timeout => "timeout",
            FinishReason::Error => "error",
        }
    }
}

/// Where a sequence is in its life.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SeqStatus {
    /// Queued, never run (or a fresh fork not yet scheduled).
    Waiting,
    /// Holds KV blocks and is scheduled every step.
    Running,
    /// Was running, lost its blocks to a higher-priority sequence, and waits to recompute.
    Preempted,
    /// Done; its blocks are freed.
    Finished,
}
