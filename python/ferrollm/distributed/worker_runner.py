"""`WorkerRunner`: a worker's `ModelRunner`, making the same collective calls as rank 0's.

``compute_logits`` of a sharded model is collective: every rank must call it as often and with
the same row counts as rank 0. On a worker it returns the rank's own vocabulary shard, which the
rank-0 post-processing (scoring prompt tokens against their ids, copying logits to the host)
cannot take, so a worker runs the forward pass and then only the projections: the step's
prompt-scoring rows and kept-logit rows in the chunks rank 0 projects them in (the same
``CHUNK_LOGITS // vocab_size`` rows at a time), then the sampled rows. Nothing is returned.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from ferrollm.executor import prompt_logprobs, step_extras
from ferrollm.executor.prompt_logprobs import PromptTargets
from ferrollm.executor.runner import ModelRunner, StepInputs
from ferrollm.executor.step_extras import EmbeddingOverride, LogitRows


class WorkerRunner(ModelRunner):
    """Runs a step on a worker rank: the forward pass and rank 0's sequence of projections."""

    def run(
        self,
        plan: StepInputs,
        prompt_targets: PromptTargets | None = None,
        *,
        embeds: EmbeddingOverride | None = None,
        keep_logits: LogitRows | None = None,
    ) -> torch.Tensor:
        """As `ModelRunner.run`, for the collectives only; an empty tensor."""
        with torch.inference_mode():
            self.kv_cache.copy_blocks(plan.block_copies)
            if len(plan.input_ids) == 0:
                return torch.empty(0)
            hidden = self.hidden_states(plan, embeds)
            if prompt_targets is not None:  # as score_prompt_tokens chunks them
                self._project(hidden, prompt_targets.token_indices, prompt_logprobs.CHUNK_LOGITS)
            if keep_logits is not None:  # as project_rows chunks them
                self._project(hidden, keep_logits.token_indices, step_extras.CHUNK_LOGITS)
            sampled = torch.from_numpy(plan.logits_indices).to(self.device)
            self.model.compute_logits(hidden.index_select(0, sampled))
            return torch.empty(0)

    def _project(
        self, hidden: torch.Tensor, token_indices: npt.NDArray[np.int64], chunk_logits: int
    ) -> None:
        rows = torch.from_numpy(token_indices).to(hidden.device)
        step = max(1, chunk_logits // self.model.vocab_size)
        for start in range(0, len(rows), step):
            self.model.compute_logits(hidden.index_select(0, rows[start : start + step]))
