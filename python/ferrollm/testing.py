"""Test oracles: pieces of the Rust core exposed one at a time, so tests and benchmarks can hold
each against a reference (transformers' sampling, a whole-text stop rule). The engine calls
none of them: sampling and stop strings run inside `Scheduler.update`. Not part of the serving
API."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ferrollm import _core
from ferrollm._core import SampleResult, SamplingParams, truncate_at_stop

__all__ = ["SampleResult", "Sampler", "truncate_at_stop"]


class Sampler:
    """The sampler the scheduler runs, on a step's logits directly (``_core.Sampler``, with
    each column spelled out)."""

    def __init__(self, logprobs_mode: str = "raw") -> None:
        self._inner = _core.Sampler(logprobs_mode)

    @property
    def logprobs_mode(self) -> str:
        """ "raw" or "processed"."""
        return self._inner.logprobs_mode

    @property
    def num_threads(self) -> int:
        """Worker threads sampling runs on (rayon's global pool)."""
        return self._inner.num_threads

    def sample(
        self,
        logits: npt.NDArray[np.float32],
        rows: Any,
        params: Sequence[SamplingParams],
        prompts: Sequence[Any],
        outputs: Sequence[Any],
        seeds: Any,
        sample_indices: Any = None,
        eos_token_ids: Sequence[int] | None = None,
    ) -> SampleResult:
        """Draw a token for each sample ``i`` from ``logits[rows[i]]`` (see
        ``_core.Sampler.sample``)."""
        extra = (sample_indices, None if eos_token_ids is None else list(eos_token_ids))
        return self._inner.sample(logits, rows, params, (prompts, outputs), seeds, extra)

    process_logits = staticmethod(_core.Sampler.process_logits)
    filtered_probs = staticmethod(_core.Sampler.filtered_probs)

    def __repr__(self) -> str:
        return f"Sampler(logprobs_mode={self.logprobs_mode!r})"
