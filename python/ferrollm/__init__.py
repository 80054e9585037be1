"""ferrollm: an LLM inference server whose hot path is Rust.

Importing the package loads only the Rust core (and numpy): the scheduler can be used from a
Python without torch.
"""

from ferrollm._core import (
    FINISH_REASON_NAMES,
    QueueFullError,
    Sampler,
    SampleResult,
    SamplingParams,
    Scheduler,
    SchedulerError,
    StepOutput,
    StepPlan,
    ValidationError,
    __version__,
)

__all__ = [
    "FINISH_REASON_NAMES",
    "QueueFullError",
    "SampleResult",
    "Sampler",
    "SamplingParams",
    "Scheduler",
    "SchedulerError",
    "StepOutput",
    "StepPlan",
    "ValidationError",
    "__version__",
]
