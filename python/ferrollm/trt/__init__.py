"""The TensorRT-LLM-style in-process request API (docs/api/trt.md): `InferenceRequest` in, named
tensors out through an `Executor` that shares the engine with the HTTP server.

`InferenceRequest` and `InferenceResponse` need only numpy; `Executor` (torch) is imported on
first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ferrollm.trt.request import InferenceRequest
from ferrollm.trt.response import InferenceResponse

if TYPE_CHECKING:
    from ferrollm.trt.executor import Executor, SendResponseCallback


def __getattr__(name: str) -> Any:
    if name in ("Executor", "SendResponseCallback"):
        return getattr(importlib.import_module("ferrollm.trt.executor"), name)
    raise AttributeError(f"module 'ferrollm.trt' has no attribute {name!r}")


__all__ = ["Executor", "InferenceRequest", "InferenceResponse", "SendResponseCallback"]
