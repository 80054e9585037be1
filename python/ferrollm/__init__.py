"""ferrollm: an LLM inference server whose hot path is Rust.

Importing the package loads only the Rust core (and numpy): the scheduler can be used from a
Python without torch. ``LLM``, ``AsyncEngine`` and the output types need torch; they are
imported on first use (``ferrollm.LLM``), not by ``import ferrollm``. The core's test oracles
(the sampler and the whole-text stop rule alone) are in ``ferrollm.testing``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ferrollm._core import (
    FINISH_REASON_NAMES,
    DecodeStream,
    Detokenizer,
    Limits,
    NewRequest,
    PrefillScheduler,
    QueueFullError,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    SchedulerError,
    StepOutput,
    StepPlan,
    StopMatcher,
    ValidationError,
    ValidRequest,
    __version__,
    validate,
)

if TYPE_CHECKING:
    from ferrollm.engine import AsyncEngine, CompletionOutput, RequestOutput
    from ferrollm.llm import LLM
    from ferrollm.lora.request import LoRARequest
    from ferrollm.trt import Executor, InferenceRequest, InferenceResponse

#: Public names imported on first use (they need torch, or live beside what does), and the
#: module each lives in.
_LAZY = {
    "LLM": "ferrollm.llm",
    "LoRARequest": "ferrollm.lora.request",
    "AsyncEngine": "ferrollm.engine",
    "CompletionOutput": "ferrollm.engine",
    "RequestOutput": "ferrollm.engine",
    "Executor": "ferrollm.trt",
    "InferenceRequest": "ferrollm.trt",
    "InferenceResponse": "ferrollm.trt",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ferrollm' has no attribute {name!r}")


__all__ = [
    "FINISH_REASON_NAMES",
    "LLM",
    "AsyncEngine",
    "CompletionOutput",
    "DecodeStream",
    "Detokenizer",
    "Executor",
    "InferenceRequest",
    "InferenceResponse",
    "Limits",
    "LoRARequest",
    "NewRequest",
    "PrefillScheduler",
    "QueueFullError",
    "RequestOutput",
    "SamplingParams",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerError",
    "StepOutput",
    "StepPlan",
    "StopMatcher",
    "ValidRequest",
    "ValidationError",
    "__version__",
    "validate",
]
