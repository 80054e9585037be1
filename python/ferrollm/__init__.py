"""ferrollm: an LLM inference server whose hot path is Rust.

Importing the package loads only the Rust core (and numpy): the scheduler can be used from a
Python without torch.
"""

from ferrollm._core import (
    FINISH_REASON_NAMES,
    DecodeStream,
    Detokenizer,
    Limits,
    QueueFullError,
    Sampler,
    SampleResult,
    SamplingParams,
    Scheduler,
    SchedulerError,
    StepOutput,
    StepPlan,
    StopMatcher,
    ValidationError,
    __version__,
    truncate_at_stop,
    validate,
)

__all__ = [
    "FINISH_REASON_NAMES",
    "DecodeStream",
    "Detokenizer",
    "Limits",
    "QueueFullError",
    "SampleResult",
    "Sampler",
    "SamplingParams",
    "Scheduler",
    "SchedulerError",
    "StepOutput",
    "StepPlan",
    "StopMatcher",
    "ValidationError",
    "__version__",
    "truncate_at_stop",
    "validate",
]
