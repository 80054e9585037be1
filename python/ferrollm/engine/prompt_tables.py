"""P-tuning on the engine side: each request's prompt embedding table, and the step's
embedding overrides built from them.

A request with a table may use prompt ids ``vocab_size + i`` for its table row ``i`` (the
scheduler admits them, ``num_virtual_tokens``); the model embeds every other id from its
embedding matrix. Generated tokens are always below ``vocab_size``, so only prompt positions
(in a prefill, chunked or recomputed) carry virtual ids. The engine salts such a request's
prefix-cache key with a digest of its table, so it shares cached blocks only with requests of
the same table.
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt
import torch

from ferrollm._core import StepPlan
from ferrollm.executor.step_extras import EmbeddingOverride


def table_digest(table: npt.NDArray[np.floating]) -> str:
    """A prefix-cache salt naming ``table`` by its shape, dtype and values."""
    digest = hashlib.sha256(f"{table.shape}{table.dtype}".encode())
    digest.update(np.ascontiguousarray(table).tobytes())
    return f"ptune:{digest.hexdigest()}"


class PromptTableBook:
    """The prompt tables of the tracked requests that have one."""

    def __init__(self, vocab_size: int = 0) -> None:
        #: The model's vocabulary: prompt ids from here on are virtual.
        self.vocab_size = vocab_size
        self._tables: dict[int, torch.Tensor] = {}

    def add(self, key: int, table: npt.NDArray[np.floating]) -> None:
        """Request ``key`` embeds prompt id ``vocab_size + i`` as ``table[i]``."""
        self._tables[key] = torch.from_numpy(np.array(table, dtype=np.float32))

    def remove(self, key: int) -> None:
        """Forget request ``key`` (finished or failed)."""
        self._tables.pop(key, None)

    def overrides(self, plan: StepPlan) -> EmbeddingOverride | None:
        """The embeddings of the virtual ids ``plan`` computes; None when it has none."""
        if not self._tables:
            return None
        ids = plan.input_ids
        virtual = np.flatnonzero(ids >= self.vocab_size)
        if not virtual.size:
            return None
        # The row each virtual token belongs to: cu_seqlens_q[r] <= index < cu_seqlens_q[r + 1].
        rows_of = np.searchsorted(plan.cu_seqlens_q, virtual, side="right") - 1
        keys = plan.req_ids[rows_of].tolist()
        embeddings = [
            self._tables[key][int(ids[i]) - self.vocab_size]
            for key, i in zip(keys, virtual.tolist(), strict=True)
        ]
        return EmbeddingOverride(
            torch.from_numpy(virtual.astype(np.int64)), torch.stack(embeddings)
        )
