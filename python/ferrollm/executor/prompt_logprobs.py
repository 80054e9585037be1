"""Prompt logprobs: scoring prompt tokens inside the normal prefill.

A request with ``prompt_logprobs`` gets, for each prompt token after the first, the raw
logprob the model gave it (log-softmax of the logits at the position before it, no logits
processors), its rank among the vocabulary (1 = most probable) and the top alternatives. They
come from the hidden states the step computes anyway (chunked prefill included): only the rows
of the positions that score a prompt token are projected to the vocabulary, a bounded chunk at
a time on the device, and only ``[rows]`` values and ``[rows, k]`` alternatives cross to the
host, never a ``[prompt_len, vocab]`` matrix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from ferrollm.executor.step_extras import logits_in_chunks


@dataclass(slots=True)
class PromptScores:
    """The scores of a step's targets, host numpy arrays aligned with the targets."""

    #: float32 ``[m]``: the target token's logprob.
    logprobs: npt.NDArray[np.float32]
    #: int64 ``[m]``: 1 + the number of tokens strictly more probable than the target.
    ranks: npt.NDArray[np.int64]
    #: int64 ``[m, k]``: the top ``k`` token ids, most probable first.
    top_ids: npt.NDArray[np.int64]
    #: float32 ``[m, k]``: their logprobs.
    top_logprobs: npt.NDArray[np.float32]


@dataclass(slots=True)
class PromptTargets:
    """The prompt positions one step scores: which hidden-state rows, and which token each
    row's logits score (the prompt token after it). The runner fills ``scores``."""

    #: int64 ``[m]``: rows of the step's hidden states (indices into ``plan.input_ids``).
    token_indices: npt.NDArray[np.int64]
    #: int64 ``[m]``: the prompt token each row scores.
    target_ids: npt.NDArray[np.int64]
    #: Alternatives to keep per row (the most any request in the step asked for).
    num_top: int
    #: Per request, in row order: its key and the prompt positions it scores (the engine's
    #: bookkeeping; the runner does not read it).
    owners: list[tuple[int, npt.NDArray[np.int64]]] = field(default_factory=list)
    #: Filled by the runner.
    scores: PromptScores | None = None


def score_prompt_tokens(
    hidden: torch.Tensor,
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    vocab_size: int,
    targets: PromptTargets,
) -> PromptScores:
    """Score ``targets`` from the step's final hidden states ``[T, hidden]`` on their device,
    at most ``step_extras.CHUNK_LOGITS`` logits at a time; call under
    ``torch.inference_mode()``."""
    wanted = torch.from_numpy(targets.target_ids).to(hidden.device)
    k = targets.num_top
    parts = []
    chunks = logits_in_chunks(hidden, compute_logits, vocab_size, targets.token_indices)
    for rows, logits in chunks:
        logprobs = logits.float().log_softmax(-1)
        chosen = logprobs.gather(1, wanted[rows, None])
        ranks = (logprobs > chosen).sum(-1) + 1
        top_logprobs, top_ids = logprobs.topk(k, -1)
        parts.append((chosen[:, 0], ranks, top_ids, top_logprobs))
    logprobs, ranks, top_ids, top_logprobs = (
        torch.cat([part[i] for part in parts]).cpu() for i in range(4)
    )
    return PromptScores(
        logprobs.numpy(), ranks.long().numpy(), top_ids.long().numpy(), top_logprobs.numpy()
    )
