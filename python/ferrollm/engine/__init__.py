"""The engine: `LLMEngine` (one step at a time), `EngineLoop` (its thread) and `AsyncEngine`.

Importing this package loads torch (the model runner); ``import ferrollm`` alone does not.
"""

from ferrollm.engine.async_engine import AsyncEngine, EngineDeadError
from ferrollm.engine.engine import LLMEngine, StepError
from ferrollm.engine.loop import EngineLoop
from ferrollm.engine.outputs import (
    CompletionOutput,
    RequestFailure,
    RequestOutput,
    StepInfo,
    TokenLogprob,
)
from ferrollm.engine.prompt_logprobs import PromptLogprob
from ferrollm.engine.request import EngineRequest

__all__ = [
    "AsyncEngine",
    "CompletionOutput",
    "EngineDeadError",
    "EngineLoop",
    "EngineRequest",
    "LLMEngine",
    "PromptLogprob",
    "RequestFailure",
    "RequestOutput",
    "StepError",
    "StepInfo",
    "TokenLogprob",
]
