"""Logits kept for requests that ask (the TensorRT-LLM-style ``return_context_logits`` and
``return_generation_logits``): the model's raw float32 logits, before any logits processor.

Context logits are the logits at every prompt position (row ``p`` predicts prompt token
``p + 1``; the last row predicts the first output token). They come from the hidden states the
prefill computes anyway, projected only for the requests that asked; they are stored by
position, so a chunked prefill fills them piece by piece and a preempted request's recompute
rewrites the same values. Such a request skips the prefix cache (the engine gives it a salt of
its own), whose hits would skip the positions it must keep.

Generation logits are the rows the step sampled each output token from, copied before the
sampler runs: one per generated token, in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ferrollm._core import StepPlan
from ferrollm.executor.step_extras import LogitRows


@dataclass(slots=True)
class CapturedLogits:
    """One request's kept logits (filled by the engine thread, append-only)."""

    #: float32 ``[num_prompt_tokens, vocab]`` when asked for, else None.
    context: npt.NDArray[np.float32] | None = None
    #: Per sequence index: one float32 ``[vocab]`` row per generated token; None when not
    #: asked for.
    generation: dict[int, list[npt.NDArray[np.float32]]] | None = None
    #: Columns of a logits row (known once a step has run).
    vocab_size: int = 0

    def generation_logits(self, index: int, num_tokens: int) -> npt.NDArray[np.float32]:
        """Sequence ``index``'s first ``num_tokens`` rows as ``[num_tokens, vocab]``."""
        rows = (self.generation or {}).get(index, [])[:num_tokens]
        if not rows:
            return np.zeros((0, self.vocab_size), dtype=np.float32)
        return np.stack(rows)


@dataclass(slots=True)
class _Keeping:
    num_prompt_tokens: int
    logits: CapturedLogits = field(default_factory=CapturedLogits)
    keeps_context: bool = False


class LogitsBook:
    """The kept logits of the tracked requests that asked for them."""

    def __init__(self) -> None:
        self._requests: dict[int, _Keeping] = {}
        self._num_context = 0

    def __bool__(self) -> bool:
        """Whether any tracked request keeps logits."""
        return bool(self._requests)

    def add(self, key: int, num_prompt_tokens: int, context: bool, generation: bool) -> None:
        """Keep request ``key``'s context and/or generation logits."""
        keeping = _Keeping(num_prompt_tokens, keeps_context=context)
        if generation:
            keeping.logits.generation = {}
        self._requests[key] = keeping
        self._num_context += context

    def remove(self, key: int) -> None:
        """Forget request ``key`` (finished or failed)."""
        keeping = self._requests.pop(key, None)
        if keeping is not None:
            self._num_context -= keeping.keeps_context

    def entries(self, key: int) -> CapturedLogits | None:
        """Request ``key``'s kept logits (shared, filled as it runs); None when it kept none."""
        keeping = self._requests.get(key)
        return None if keeping is None else keeping.logits

    def context_rows(self, plan: StepPlan) -> LogitRows | None:
        """The prompt positions ``plan`` computes for requests keeping context logits."""
        if not self._num_context:
            return None
        cu, positions = plan.cu_seqlens_q, plan.positions
        rows: list[npt.NDArray[np.int64]] = []
        owners: list[tuple[int, npt.NDArray[np.int64]]] = []
        for r, key in enumerate(plan.req_ids.tolist()):
            keeping = self._requests.get(key)
            if keeping is None or not keeping.keeps_context:
                continue
            start, end = int(cu[r]), int(cu[r + 1])
            in_prompt = positions[start:end] < keeping.num_prompt_tokens
            if in_prompt.any():
                rows.append(np.arange(start, end, dtype=np.int64)[in_prompt])
                owners.append((key, positions[start:end][in_prompt]))
        if not rows:
            return None
        return LogitRows(np.concatenate(rows), owners)

    def record(
        self, plan: StepPlan, context: LogitRows | None, logits: npt.NDArray[np.float32]
    ) -> None:
        """Store the step's context rows (``context.logits``) and, before sampling, the
        sampled rows of ``logits [num_samples, vocab]`` of requests keeping them."""
        if not self._requests:
            return
        if context is not None and context.logits is not None:
            self._store_context(context, context.logits)
        req_ids = plan.req_ids
        for i, (row, seq) in enumerate(
            zip(plan.sample_rows.tolist(), plan.sample_seq_indices.tolist(), strict=True)
        ):
            keeping = self._requests.get(int(req_ids[row]))
            if keeping is not None and keeping.logits.generation is not None:
                keeping.logits.vocab_size = logits.shape[1]
                keeping.logits.generation.setdefault(seq, []).append(logits[i].copy())

    def _store_context(self, context: LogitRows, values: npt.NDArray[np.float32]) -> None:
        offset = 0
        for key, positions in context.owners:
            keeping = self._requests.get(key)
            if keeping is not None:
                kept = keeping.logits
                if kept.context is None:
                    kept.vocab_size = values.shape[1]
                    shape = (keeping.num_prompt_tokens, values.shape[1])
                    kept.context = np.zeros(shape, dtype=np.float32)
                kept.context[positions] = values[offset : offset + len(positions)]
            offset += len(positions)
