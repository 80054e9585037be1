//! The one error type of the core. Every message names the offending field in backticks and the
//! rule it broke; the Python binding maps each variant to one exception class, once.

use thiserror::Error;

/// Errors returned by the core. None of them leaves the scheduler in an inconsistent state.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum CoreError {
    /// A caller-supplied value breaks a rule. `param` is the field (a path such as
    /// `messages[0].content` for nested fields), `code` a stable short tag.
    #[error("{message}")]
    Invalid {
        param: String,
        code: &'static str,
        message: String,
    },
    /// The waiting queue is at `max_num_waiting`; the server answers 503 with Retry-After.
    #[error("the waiting queue is full ({max_num_waiting} requests waiting); retry later")]
    QueueFull { max_num_waiting: usize },
    /// `update()` was given a plan other than the one the last `schedule()` returned.
    #[error("the plan is from step {got} but the scheduler expects step {expected}: call update() once per schedule(), with that plan")]
    StalePlan { got: u64, expected: u64 },
}

impl CoreError {
    /// Shorthand for [`CoreError::Invalid`].
    pub fn invalid(
        param: impl Into<String>,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        CoreError::Invalid {
            param: param.into(),
            code,
            message: message.into(),
        }
    }
}

/// Result alias of the core.
pub type CoreResult<T> = Result<T, CoreError>;
