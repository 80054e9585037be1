"""What a step may need beyond its plan: per-token embedding overrides (p-tuning) and the
rows whose full logits a request keeps (context logits).

Both are built by the engine from its per-request books and read by ``ModelRunner.run``;
a step without either passes None and pays nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

#: Float32 logits per chunk (64 MiB): the rows projected at once are this over the vocabulary.
CHUNK_LOGITS = 1 << 24


@dataclass(frozen=True, slots=True)
class EmbeddingOverride:
    """Tokens of the step whose input embedding is a given row instead of the embedding
    matrix's (a request's prompt-table row for a virtual prompt id)."""

    #: int64 ``[m]``: indices into the step's ``input_ids``.
    token_indices: torch.Tensor
    #: ``[m, hidden]``: the embedding of each of those tokens.
    rows: torch.Tensor

    def to(self, device: torch.device) -> EmbeddingOverride:
        """The same override with both tensors on ``device``."""
        return EmbeddingOverride(
            self.token_indices.to(device, non_blocking=True), self.rows.to(device)
        )


@dataclass(slots=True)
class LogitRows:
    """Tokens of the step whose full logits requests keep; the runner fills ``logits``."""

    #: int64 ``[m]``: rows of the step's hidden states (indices into ``plan.input_ids``).
    token_indices: npt.NDArray[np.int64]
    #: Per request, in row order: its key and the positions of its rows (the engine's
    #: bookkeeping; the runner does not read it).
    owners: list[tuple[int, npt.NDArray[np.int64]]] = field(default_factory=list)
    #: float32 ``[m, vocab]`` on the host, filled by the runner.
    logits: npt.NDArray[np.float32] | None = None


def project_rows(
    hidden: torch.Tensor,
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    vocab_size: int,
    token_indices: npt.NDArray[np.int64],
) -> npt.NDArray[np.float32]:
    """Float32 logits ``[m, vocab]`` on the host of the hidden-state rows ``token_indices``,
    at most ``CHUNK_LOGITS`` logits at a time on the device; call under inference mode."""
    parts = [
        logits.float().cpu()
        for _, logits in logits_in_chunks(hidden, compute_logits, vocab_size, token_indices)
    ]
    return torch.cat(parts).numpy()


def logits_in_chunks(
    hidden: torch.Tensor,
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    vocab_size: int,
    token_indices: npt.NDArray[np.int64],
) -> Iterator[tuple[slice, torch.Tensor]]:
    """The logits of the hidden-state rows ``token_indices``, ``CHUNK_LOGITS // vocab_size``
    rows at a time, each with the slice of ``token_indices`` it covers.

    Every projection of extra rows goes through here, on every rank of a tensor-parallel
    group (``compute_logits`` is collective there), so all ranks make the same calls.
    """
    rows = torch.from_numpy(token_indices).to(hidden.device)
    step = max(1, CHUNK_LOGITS // vocab_size)
    for start in range(0, len(rows), step):
        part = slice(start, start + step)
        yield part, compute_logits(hidden.index_select(0, rows[part]))


def combine_overrides(*overrides: EmbeddingOverride | None) -> EmbeddingOverride | None:
    """One override of every token the given ones replace (their tokens are disjoint: a
    prompt table's virtual ids and media placeholders never share a position); None if none.
    The rows go to the last one's device (media rows are made on the model's)."""
    present = [o for o in overrides if o is not None]
    if len(present) <= 1:
        return present[0] if present else None
    device = present[-1].rows.device
    return EmbeddingOverride(
        torch.cat([o.token_indices for o in present]),
        torch.cat([o.rows.to(device, torch.float32) for o in present]),
    )
