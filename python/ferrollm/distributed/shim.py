"""TP-SHIM: replaced by the sharded load_model at merge.

Until the sharded model lands, every rank builds the whole (replicated) model: each rank then
computes the same thing, so the runtime's protocol (plan broadcast, start-up agreement, faults)
runs for real. At merge, ``build_runner`` calls ``ferrollm.engine.engine.load_model`` directly
and this module goes.
"""

from __future__ import annotations

import torch

from ferrollm.distributed.state import SINGLE, ParallelState
from ferrollm.executor.loader import ModelSource
from ferrollm.models.llama import LlamaForCausalLM
from ferrollm.models.registry import build_model


def load_model(
    source: ModelSource,
    device: torch.device,
    dtype: torch.dtype,
    quantization: str | None = None,
    parallel: ParallelState = SINGLE,
) -> LlamaForCausalLM:
    """The whole model on every rank (``parallel`` is not used yet), as
    ``ferrollm.engine.engine.load_model`` builds it (not imported: the engine imports this)."""
    # TP-SHIM: replaced by the sharded load_model at merge
    model = build_model(source.config, device, dtype, quantization)
    model.load_weights(source.iter_weights(dtype, keep_quantized=quantization is not None))
    return model
