"""Teacher-forced scoring of a model file, shared by the quantized-quality tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ferrollm.engine.build import load_model
from ferrollm.executor.kv_cache import KVCacheSpec
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
    c = source.config
    kv_dtype = resolve_kv_dtype(get_platform("cpu"), "auto", dtype, quantization)
    spec = KVCacheSpec(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 16, kv_dtype)
    return model, teacher_forced_scores(model, ids, spec, CPU)
