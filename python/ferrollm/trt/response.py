"""`InferenceResponse`: the named output tensors (docs/api/trt.md#responses), built from the
engine's `RequestOutput`s.

* ``output_ids`` ``[beam_width, num_output_tokens]`` int32: generated tokens only
  (docs/decisions.md#what-output-ids-hold); beams that ended early are padded with ``pad_id``
  (``end_id`` when ``pad_id`` is not set);
* ``sequence_length`` ``[beam_width]`` int32: the valid tokens of each beam;
* ``output_log_probs`` ``[1, beam_width, num_output_tokens]`` and ``cum_log_probs``
  ``[1, beam_width]`` float32, with ``return_log_probs``;
* ``context_logits`` ``[1, num_input_tokens, vocab]`` float32, with ``return_context_logits``;
* ``generation_logits`` ``[1, beam_width, num_output_tokens, vocab]`` float32, with
  ``return_generation_logits`` (the model's raw logits, before any logits processor).

Streaming sends one token per response (``sequence_length`` 1), ``is_final`` on the last, and
the context logits with the first; beam search sends one final response with the full beams
(docs/decisions.md#streaming-beam-search). A failure is a final response with ``err_msg`` and no
tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from ferrollm.engine.outputs import CompletionOutput, RequestOutput

Tensor = npt.NDArray[Any]


@dataclass(frozen=True)
class InferenceResponse:
    """One response of a request: its tensors by name, whether it is the last, and the error
    that ended the request (empty when none)."""

    request_id: int
    tensors: dict[str, Tensor] = field(default_factory=dict)
    is_final: bool = False
    err_msg: str = ""

    def _get(self, name: str) -> Tensor | None:
        return self.tensors.get(name)

    @property
    def output_ids(self) -> Tensor | None:
        """int32 ``[beam_width, num_output_tokens]``."""
        return self._get("output_ids")

    @property
    def sequence_length(self) -> Tensor | None:
        """int32 ``[beam_width]``."""
        return self._get("sequence_length")

    @property
    def output_log_probs(self) -> Tensor | None:
        """float32 ``[1, beam_width, num_output_tokens]`` (with ``return_log_probs``)."""
        return self._get("output_log_probs")

    @property
    def cum_log_probs(self) -> Tensor | None:
        """float32 ``[1, beam_width]`` (with ``return_log_probs``)."""
        return self._get("cum_log_probs")

    @property
    def context_logits(self) -> Tensor | None:
        """float32 ``[1, num_input_tokens, vocab]`` (with ``return_context_logits``)."""
        return self._get("context_logits")

    @property
    def generation_logits(self) -> Tensor | None:
        """float32 ``[1, beam_width, num_output_tokens, vocab]``."""
        return self._get("generation_logits")


@dataclass(frozen=True, slots=True)
class ResponseShape:
    """What one request's responses hold (from its validated tensors)."""

    beam_width: int
    streaming: bool
    pad_id: int
    log_probs: bool
    context_logits: bool
    generation_logits: bool


def final_tensors(out: RequestOutput, shape: ResponseShape) -> dict[str, Tensor]:
    """The tensors of a non-streamed request's one response: every beam, padded."""
    seqs = sorted(out.outputs, key=lambda c: c.index)[: shape.beam_width]
    lengths = [len(c.token_ids) for c in seqs]
    width = max(lengths, default=0)
    ids = np.full((shape.beam_width, width), shape.pad_id, dtype=np.int32)
    for b, c in enumerate(seqs):
        ids[b, : lengths[b]] = c.token_ids
    tensors: dict[str, Tensor] = {
        "output_ids": ids,
        "sequence_length": np.array(lengths + [0] * (shape.beam_width - len(seqs)), dtype=np.int32),
    }
    if shape.log_probs:
        logprobs = np.zeros((1, shape.beam_width, width), dtype=np.float32)
        cum = np.zeros((1, shape.beam_width), dtype=np.float32)
        for b, c in enumerate(seqs):
            values = _logprobs(c)
            logprobs[0, b, : len(values)] = values
            cum[0, b] = c.cumulative_logprob or 0.0
        tensors["output_log_probs"], tensors["cum_log_probs"] = logprobs, cum
    _add_logits(tensors, out, shape, [(c.index, 0, lengths[b]) for b, c in enumerate(seqs)])
    return tensors


def stream_tensors(
    out: RequestOutput, shape: ResponseShape, num_sent: int
) -> list[dict[str, Tensor]]:
    """One tensor map per token of ``out`` after the first ``num_sent`` (beam width 1)."""
    seq = out.outputs[0] if out.outputs else None
    token_ids = seq.token_ids if seq is not None else []
    logprobs = _logprobs(seq) if seq is not None and shape.log_probs else []
    maps = []
    for k in range(num_sent, len(token_ids)):
        tensors: dict[str, Tensor] = {
            "output_ids": np.array([[token_ids[k]]], dtype=np.int32),
            "sequence_length": np.array([1], dtype=np.int32),
        }
        if shape.log_probs:
            tensors["output_log_probs"] = np.array([[[logprobs[k]]]], dtype=np.float32)
            tensors["cum_log_probs"] = np.array([[sum(logprobs[: k + 1])]], dtype=np.float32)
        _add_logits(tensors, out, shape, [(0, k, k + 1)], with_context=k == 0)
        maps.append(tensors)
    return maps


def empty_stream_tensors() -> dict[str, Tensor]:
    """A streamed request's final response when it ended without a new token."""
    return {
        "output_ids": np.zeros((1, 0), dtype=np.int32),
        "sequence_length": np.zeros(1, dtype=np.int32),
    }


def _logprobs(seq: CompletionOutput) -> list[float]:
    return [lp.logprob for lp in seq.logprobs or ()]


def _add_logits(
    tensors: dict[str, Tensor],
    out: RequestOutput,
    shape: ResponseShape,
    spans: list[tuple[int, int, int]],
    with_context: bool = True,
) -> None:
    """Context logits (when asked and ``with_context``) and generation logits rows
    ``[start, end)`` of each ``(sequence index, start, end)`` in ``spans``, padded with 0."""
    kept = out.logits
    if kept is None:
        return
    if shape.context_logits and with_context and kept.context is not None:
        tensors["context_logits"] = kept.context[None]
    if shape.generation_logits:
        width = max((end - start for _, start, end in spans), default=0)
        logits = np.zeros((1, shape.beam_width, width, kept.vocab_size), dtype=np.float32)
        for b, (index, start, end) in enumerate(spans):
            rows = kept.generation_logits(index, end)[start:]
            logits[0, b, : len(rows)] = rows
        tensors["generation_logits"] = logits
