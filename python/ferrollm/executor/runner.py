"""The model runner: a ``StepPlan`` in, the logits to sample out.

``run(plan)`` copies forked blocks, moves the plan's columns to the device, runs the model over
every scheduled token, and projects only the sampled positions (``plan.logits_indices``) to the
vocabulary. The result is CPU float32 and C-contiguous, so ``.numpy()`` is a zero-copy view the
Rust sampler reads directly.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from ferrollm.executor.kv_cache import KVCache
from ferrollm.layers.attention import (
    AttentionBackend,
    AttentionContext,
    PagedBatch,
    TorchSDPABackend,
)


class CausalLM(Protocol):
    """What the runner needs of a model (``LlamaForCausalLM`` and its kin)."""

    sliding_window: int | None

    @property
    def vocab_size(self) -> int: ...

    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


class StepInputs(PagedBatch, Protocol):
    """The parts of a ``ferrollm.StepPlan`` the runner reads."""

    @property
    def input_ids(self) -> npt.NDArray[np.int64]: ...
    @property
    def logits_indices(self) -> npt.NDArray[np.int64]: ...
    @property
    def block_copies(self) -> npt.NDArray[np.int32]: ...


class ModelRunner:
    """Runs one model over a paged KV cache, one scheduler step at a time."""

    def __init__(
        self,
        model: CausalLM,
        kv_cache: KVCache,
        device: torch.device,
        dtype: torch.dtype,
        backend: AttentionBackend | None = None,
    ) -> None:
        if kv_cache.spec.dtype != dtype:
            raise ValueError(
                f"KV cache dtype {kv_cache.spec.dtype} differs from model dtype {dtype}"
            )
        self.model = model
        self.kv_cache = kv_cache
        self.device = device
        self.dtype = dtype
        self.backend: AttentionBackend = backend or TorchSDPABackend()

    def run(self, plan: StepInputs) -> torch.Tensor:
        """Float32 logits ``[plan.num_samples, vocab]`` on the CPU, row ``i`` for sample ``i``."""
        with torch.inference_mode():
            self.kv_cache.copy_blocks(plan.block_copies)
            if len(plan.input_ids) == 0:
                return torch.empty((0, self.model.vocab_size), dtype=torch.float32)
            hidden = self.model(
                self._to_device(plan.input_ids),
                self._to_device(plan.positions),
                self._context(plan),
            )
            sampled = hidden.index_select(0, self._to_device(plan.logits_indices))
            logits = self.model.compute_logits(sampled)
            return logits.to("cpu", torch.float32).contiguous()

    def _context(self, plan: StepInputs) -> AttentionContext:
        metadata = self.backend.prepare(
            plan, self.kv_cache.block_size, self.device, self.model.sliding_window
        )
        return AttentionContext(self.backend, metadata, self.kv_cache.layers)

    def _to_device(self, array: npt.NDArray[np.int64]) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device, non_blocking=True)
