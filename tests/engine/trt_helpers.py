"""A shared tiny-model `Executor` for the TRT-API tests, and shorthands over it."""

from __future__ import annotations

from typing import Any

import numpy as np

from ferrollm.trt import Executor, InferenceRequest, InferenceResponse

#: Seconds a request may take before a test fails instead of hanging.
TIMEOUT = 60.0
PROMPT = [5, 6, 7, 8, 9]
ENGINE_OPTIONS: dict[str, Any] = {
    "device": "cpu",
    "dtype": "float32",
    "seed": 0,
    "max_model_len": 256,
    "kv_cache_memory": "8MiB",
    "block_size": 4,
}


def run(
    executor: Executor, prompt: list[int] | None = None, n: int = 12, **tensors: Any
) -> InferenceResponse:
    """The final response of a non-streamed request; fails on an error response."""
    response = executor.generate(InferenceRequest(prompt or PROMPT, n, **tensors), TIMEOUT)
    assert response.err_msg == "" and response.is_final, response.err_msg
    return response


def tokens(
    executor: Executor, prompt: list[int] | None = None, n: int = 12, **tensors: Any
) -> list[int]:
    """Beam 0's valid output tokens."""
    response = run(executor, prompt, n, **tensors)
    assert response.output_ids is not None and response.sequence_length is not None
    return list(response.output_ids[0, : response.sequence_length[0]].tolist())


def error(executor: Executor, prompt: list[int] | None = None, n: int = 4, **tensors: Any) -> str:
    """The err_msg of a request that must fail (one final response, no tensors)."""
    response = executor.generate(InferenceRequest(prompt or PROMPT, n, **tensors), TIMEOUT)
    assert response.is_final and response.tensors == {} and response.err_msg
    return response.err_msg


def sampling(**extra: Any) -> dict[str, Any]:
    """Full-distribution sampling (the HTTP mapping's top-k 0, top-p 1.0,
    docs/decisions.md#absent-top-k-and-top-p)."""
    return {"runtime_top_k": 0, "runtime_top_p": 1.0, **extra}


def has_repeated_ngram(ids: list[int], n: int) -> bool:
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    return len(grams) != len(set(grams))


def as_array(value: Any) -> np.ndarray:
    assert value is not None
    return np.asarray(value)
