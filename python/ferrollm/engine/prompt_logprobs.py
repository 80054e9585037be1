"""Prompt logprobs on the engine side: which prompt positions a step scores, and the scores
kept per request, by prompt position.

A step's plan says, per row, the request and the positions it computes; a position ``p`` with
``p + 1 < num_prompt_tokens`` scores prompt token ``p + 1``. Scores are stored by position, so
a chunked prefill fills them piece by piece and a preempted request's recompute overwrites
them (with the same values) instead of adding to them. The first prompt token has no score
(nothing comes before it): its entry is None, as in vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ferrollm._core import StepPlan
from ferrollm.executor.prompt_logprobs import PromptScores, PromptTargets


@dataclass(frozen=True, slots=True)
class PromptLogprob:
    """One prompt token's score: the raw logprob the model gave it (no logits processors),
    its rank in the vocabulary (1 = most probable), and the top alternatives."""

    token_id: int
    logprob: float
    rank: int
    #: ``(token id, logprob)`` of the ``prompt_logprobs`` most probable tokens, best first.
    top: tuple[tuple[int, float], ...] = ()


@dataclass(slots=True)
class _Scoring:
    prompt_token_ids: npt.NDArray[np.int64]
    num_top: int
    entries: list[PromptLogprob | None]


class PromptLogprobBook:
    """The prompt logprobs of the tracked requests that asked for them."""

    def __init__(self) -> None:
        self._requests: dict[int, _Scoring] = {}

    def add(self, key: int, prompt_token_ids: npt.NDArray[np.integer], num_top: int) -> None:
        """Score request ``key``'s prompt with ``num_top`` alternatives per token."""
        ids = prompt_token_ids.astype(np.int64)
        self._requests[key] = _Scoring(ids, num_top, [None] * len(ids))

    def remove(self, key: int) -> None:
        """Forget request ``key`` (finished or failed)."""
        self._requests.pop(key, None)

    def entries(self, key: int) -> list[PromptLogprob | None] | None:
        """Request ``key``'s scores by prompt position (the first is None); None when it did
        not ask. The list is shared, not copied: once the prefill is done its values no
        longer change (a recompute writes the same ones)."""
        scoring = self._requests.get(key)
        return None if scoring is None else scoring.entries

    def targets(self, plan: StepPlan) -> PromptTargets | None:
        """The prompt positions ``plan`` computes for requests that asked; None when none."""
        if not self._requests:
            return None
        cu = plan.cu_seqlens_q
        positions = plan.positions
        rows: list[npt.NDArray[np.int64]] = []
        owners: list[tuple[int, npt.NDArray[np.int64]]] = []
        num_top = 0
        for r, key in enumerate(plan.req_ids.tolist()):
            scoring = self._requests.get(key)
            if scoring is None:
                continue
            start, end = int(cu[r]), int(cu[r + 1])
            scored = positions[start:end] + 1 < len(scoring.prompt_token_ids)
            if not scored.any():
                continue
            rows.append(np.arange(start, end, dtype=np.int64)[scored])
            owners.append((key, positions[start:end][scored]))
            num_top = max(num_top, scoring.num_top)
        if not rows:
            return None
        targets = np.concatenate(
            [self._requests[key].prompt_token_ids[pos + 1] for key, pos in owners]
        )
        return PromptTargets(np.concatenate(rows), targets, num_top, owners=owners)

    def record(self, targets: PromptTargets) -> None:
        """Store the scores the runner put in ``targets``, by request and position."""
        scores = targets.scores
        if scores is None:
            return
        offset = 0
        for key, positions in targets.owners:
            scoring = self._requests.get(key)
            if scoring is not None:
                _store(scoring, positions, scores, offset)
            offset += len(positions)


def _store(scoring: _Scoring, positions: npt.NDArray[np.int64], s: PromptScores, at: int) -> None:
    k = scoring.num_top
    end = at + len(positions)
    ids = scoring.prompt_token_ids
    top_ids = s.top_ids[at:end, :k].tolist()
    top_lps = s.top_logprobs[at:end, :k].tolist()
    for i, (p, lp, rank) in enumerate(
        zip(positions.tolist(), s.logprobs[at:end].tolist(), s.ranks[at:end].tolist(), strict=True)
    ):
        top = tuple(zip(top_ids[i], top_lps[i], strict=True))
        scoring.entries[p + 1] = PromptLogprob(int(ids[p + 1]), lp, rank, top)
