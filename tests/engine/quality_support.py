"""Teacher-forced scoring of a model file, shared by the quantized-quality tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ferrollm.engine.build import load_model
from ferrollm.executor.loader import load_model_source
from ferrollm.executor.runner import teacher_forced_scores
from ferrollm.executor.sizing import resolve_kv_dtype
from ferrollm.platforms import get_platform

CPU = torch.device("cpu")


def scores(path: Path, dtype: torch.dtype, quantization: str | None, ids: np.ndarray) -> Any:
    """``(model, (logprobs, top1))``: teacher-forced scores of ``ids`` with the KV cache dtype
    the engine picks for this mode."""
    source = load_model_source(path)
    model = load_model(source, CPU, dtype, quantization)
    kv_dtype = resolve_kv_dtype(get_platform("cpu"), "auto", dtype, quantization)
    spec = model.kv_cache_spec(16, kv_dtype)
    return model, teacher_forced_scores(model, ids, spec, CPU)
