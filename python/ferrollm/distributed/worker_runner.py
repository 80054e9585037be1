"""`WorkerRunner`: a worker's `ModelRunner`, making the same collective calls as rank 0's.

``compute_logits`` of a sharded model is collective: every rank must call it as often and with
the same row counts as rank 0. On a worker it returns the rank's own vocabulary shard, which the
rank-0 post-processing (scoring prompt tokens against their ids, copying logits to the host)
cannot take, so a worker runs the forward pass and then only the projections: the step's
prompt-scoring rows and kept-logit rows through the same ``logits_in_chunks`` rank 0 projects
them with, then the sampled rows. Nothing is returned.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from ferrollm.executor.prompt_logprobs import PromptTargets
from ferrollm.executor.runner import ModelRunner, StepInputs
from ferrollm.executor.step_extras import EmbeddingOverride, LogitRows, logits_in_chunks


class WorkerRunner(ModelRunner):
    """Runs a step on a worker rank: the forward pass and rank 0's sequence of projections."""

    def run(
        self,
        plan: StepInputs,
        prompt_targets: PromptTargets | None = None,
        *,
        embeds: EmbeddingOverride | None = None,
        keep_logits: LogitRows | None = None,
        positions: npt.NDArray[np.int64] | None = None,
    ) -> torch.Tensor:
        """As `ModelRunner.run`, for the collectives only; an empty tensor (``positions``, a
        media model's, never reach a worker: such models run on one device)."""
        if positions is not None:
            raise ValueError("M-RoPE positions need a single-device engine")
        with torch.inference_mode():
            self.kv_cache.copy_blocks(plan.block_copies)
            if len(plan.input_ids) == 0:
                return torch.empty(0)
            hidden = self.hidden_states(plan, embeds)
            # The chunks rank 0's score_prompt_tokens and project_rows project.
            for extra in (prompt_targets, keep_logits):
                if extra is not None:
                    for _ in logits_in_chunks(
                        hidden,
                        self.model.compute_logits,
                        self.model.vocab_size,
                        extra.token_indices,
                    ):
                        pass
            sampled = torch.from_numpy(plan.logits_indices).to(self.device)
            self.model.compute_logits(hidden.index_select(0, sampled))
            return torch.empty(0)
