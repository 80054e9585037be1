"""`RequestTracker`: from the scheduler's columns to `RequestOutput`s.

The scheduler reports a step as flat columns (one entry per sample); the tracker maps string
request ids to the scheduler's integer ids and turns the columns into one `RequestOutput` per
request that changed, accumulating each sequence's tokens, text and logprobs (see
``engine/outputs.py`` for what an output holds). A request whose step appended nothing it shows
(``StepOutput.held_req_ids``: a ``best_of`` request's candidates, held and ranked in Rust) gets
an output with no sequence, marking the step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count
from typing import TYPE_CHECKING, Any

import numpy.typing as npt

from ferrollm._core import FINISH_REASON_NAMES, SamplingParams, StepOutput, StepPlan
from ferrollm.engine.captured_logits import CapturedLogits, LogitsBook
from ferrollm.engine.media import MediaBook
from ferrollm.engine.outputs import (
    CompletionOutput,
    RequestFailure,
    RequestOutput,
    SequenceState,
    StepInfo,
    TokenLogprob,
)
from ferrollm.engine.prompt_logprobs import PromptLogprob, PromptLogprobBook
from ferrollm.engine.prompt_tables import PromptTableBook

if TYPE_CHECKING:
    from ferrollm.engine.request import EngineRequest
    from ferrollm.lora.manager import LoRAManager


@dataclass(slots=True)
class _RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    #: ``params.stop``, read once (the property builds a new list each time).
    stop: list[str]
    seqs: list[SequenceState]
    #: per sequence index: (tokens added, text added) this step.
    new: dict[int, tuple[int, str]] = field(default_factory=dict)
    first_scheduled_time: float | None = None


@dataclass(frozen=True, slots=True)
class _Columns:
    """A StepOutput's columns as Python lists (one conversion per step, not per sample)."""

    req_ids: list[int]
    seq_indices: list[int]
    token_ids: list[int]
    finish_reasons: list[int]
    text_offsets: list[int]
    stop_str_indices: list[int]
    stop_token_ids: list[int]
    logprobs: list[float]
    sequence_scores: list[float]
    top_token_ids: list[list[int]]
    top_logprobs: list[list[float]]
    logprob_bytes: bytes
    logprob_byte_offsets: list[int]

    @classmethod
    def of(cls, out: StepOutput) -> _Columns:
        return cls(
            out.req_ids.tolist(),
            out.seq_indices.tolist(),
            out.token_ids.tolist(),
            out.finish_reasons.tolist(),
            out.text_offsets.tolist(),
            out.stop_str_indices.tolist(),
            out.stop_token_ids.tolist(),
            out.logprobs.tolist(),
            out.sequence_scores.tolist(),
            out.top_token_ids.tolist(),
            out.top_logprobs.tolist(),
            out.logprob_bytes,
            out.logprob_byte_offsets.tolist(),
        )

    def token_logprob(self, i: int) -> TokenLogprob:
        """Sample ``i``'s logprob entry: the chosen token and its alternatives, with bytes."""
        top = self.top_token_ids[i]
        width = len(top)
        offsets = self.logprob_byte_offsets[i * (1 + width) : (i + 1) * (1 + width) + 1]
        pieces = [self.logprob_bytes[a:b] for a, b in itertools.pairwise(offsets)]
        kept = [k for k, t in enumerate(top) if t >= 0]
        return TokenLogprob(
            self.token_ids[i],
            self.logprobs[i],
            tuple((top[k], self.top_logprobs[i][k]) for k in kept),
            pieces[0],
            tuple(pieces[1 + k] for k in kept),
        )


class RequestTracker:
    """Maps string request ids to the scheduler's integer ids and accumulates their outputs."""

    def __init__(self, vocab_size: int = 0) -> None:
        self._next_id = count()
        self._ids: dict[str, int] = {}
        self._states: dict[int, _RequestState] = {}
        #: Prompt logprobs of the requests that asked for them.
        self.prompt_logprobs = PromptLogprobBook()
        #: Raw logits of the requests that keep them.
        self.logits = LogitsBook()
        #: P-tuning tables of the requests that have one.
        self.prompt_tables = PromptTableBook(vocab_size)
        #: Media of the requests that have some.
        self.media = MediaBook()
        #: The LoRA adapters requests pin (``LLMEngine.lora``), when adapters are enabled.
        self.adapters: LoRAManager | None = None

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._ids))

    def next_id(self) -> int:
        """A fresh scheduler id (never reused, so a late report cannot reach a new request)."""
        return next(self._next_id)

    def add(self, request: EngineRequest, internal_id: int) -> None:
        """Track a request the scheduler has accepted under ``internal_id``."""
        params = request.params
        logprobs = params.logprobs is not None
        ranked = params.best_of > params.n and not params.use_beam_search
        seqs = [
            SequenceState(
                i, logprobs=[] if logprobs else None, token_logprobs=[] if ranked else None
            )
            for i in range(params.n)
        ]
        state = _RequestState(
            request.request_id,
            request.prompt,
            request.prompt_token_ids.tolist(),
            params,
            params.stop,
            seqs,
        )
        self._ids[request.request_id] = internal_id
        self._states[internal_id] = state
        if params.prompt_logprobs is not None:
            self.prompt_logprobs.add(internal_id, request.prompt_token_ids, params.prompt_logprobs)
        if request.return_context_logits or request.return_generation_logits:
            self.logits.add(
                internal_id,
                request.num_prompt_tokens,
                request.return_context_logits,
                request.return_generation_logits,
            )
        if request.prompt_table is not None:
            self.prompt_tables.add(internal_id, request.prompt_table)
        if request.media:
            self.media.add(internal_id, request.media)

    def internal_id(self, request_id: str) -> int | None:
        """The scheduler's id of a tracked request."""
        return self._ids.get(request_id)

    def request_ids(self, internal_ids: npt.NDArray[Any]) -> list[str]:
        """The tracked requests among ``internal_ids`` (unique, in order)."""
        states = (self._states.get(i) for i in dict.fromkeys(internal_ids.tolist()))
        return [s.request_id for s in states if s is not None]

    def remove(self, request_id: str) -> None:
        """Stop tracking a request (it failed); later reports about it are ignored."""
        internal_id = self._ids.pop(request_id, None)
        if internal_id is not None:
            del self._states[internal_id]
            self.prompt_logprobs.remove(internal_id)
            self.logits.remove(internal_id)
            self.prompt_tables.remove(internal_id)
            self.media.remove(internal_id)
            if self.adapters is not None:
                self.adapters.unbind(internal_id)

    def deliver(
        self, plan: StepPlan, out: StepOutput, step: StepInfo | None = None
    ) -> list[RequestOutput | RequestFailure]:
        """One output per request that changed in the step of ``plan``; finished ones end.

        A request that failed alone in the step (``out.failed_req_ids``) gets a
        `RequestFailure` (the scheduler's `ValidationError`, with its ``param`` and ``code``)
        and is forgotten.
        """
        if step is not None:
            self._note_scheduled(plan, step.started)
        touched: dict[int, _RequestState] = {}
        ended = plan.finished_req_ids.tolist()
        for internal_id, code in zip(ended, plan.finished_reasons.tolist(), strict=True):
            self._end_request(internal_id, FINISH_REASON_NAMES[code], touched)
        if len(out):
            self._append(_Columns.of(out), out.text, touched)
        for internal_id in out.held_req_ids.tolist():
            if (state := self._states.get(internal_id)) is not None:
                touched[internal_id] = state
        finished = {*ended, *out.finished_req_ids.tolist()}
        outputs: list[RequestOutput | RequestFailure] = [
            _snapshot(
                state, i in finished, step, self.prompt_logprobs.entries(i), self.logits.entries(i)
            )
            for i, state in touched.items()
        ]
        for internal_id in finished & touched.keys():
            self.remove(touched[internal_id].request_id)
        outputs += self._failures(out)
        return outputs

    def _failures(self, out: StepOutput) -> list[RequestFailure]:
        failures = []
        for internal_id, error in zip(out.failed_req_ids.tolist(), out.failed_errors, strict=True):
            state = self._states.get(internal_id)
            if state is not None:
                failures.append(RequestFailure(state.request_id, error))
                self.remove(state.request_id)
        return failures

    def _note_scheduled(self, plan: StepPlan, started: float) -> None:
        for internal_id in dict.fromkeys(plan.req_ids.tolist()):
            state = self._states.get(internal_id)
            if state is not None and state.first_scheduled_time is None:
                state.first_scheduled_time = started

    def _end_request(
        self, internal_id: int, reason: str, touched: dict[int, _RequestState]
    ) -> None:
        state = self._states.get(internal_id)
        if state is None:
            return
        for seq in state.seqs:
            if seq.finish_reason is None:
                seq.finish_reason = reason
        touched[internal_id] = state

    def _append(self, cols: _Columns, text: str, touched: dict[int, _RequestState]) -> None:
        offsets = cols.text_offsets
        for i, internal_id in enumerate(cols.req_ids):
            state = self._states.get(internal_id)
            if state is None:
                continue
            touched[internal_id] = state
            seq = state.seqs[cols.seq_indices[i]]
            token = cols.token_ids[i]
            piece = text[offsets[i] : offsets[i + 1]]
            seq.token_ids.append(token)
            if piece:
                seq.text_pieces.append(piece)
            if seq.logprobs is not None:
                seq.logprobs.append(cols.token_logprob(i))
            if not math.isnan(score := cols.sequence_scores[i]):
                seq.score = score
            if seq.token_logprobs is not None:
                seq.token_logprobs.append(cols.logprobs[i])
            if cols.finish_reasons[i]:
                seq.finish_reason = FINISH_REASON_NAMES[cols.finish_reasons[i]]
                seq.stop_reason = _stop_reason(
                    state, cols.stop_str_indices[i], cols.stop_token_ids[i]
                )
            num_new, new_text = state.new.get(seq.index, (0, ""))
            state.new[seq.index] = (num_new + 1, new_text + piece)


def _stop_reason(state: _RequestState, stop_str_index: int, stop_token_id: int) -> str | int | None:
    # vLLM's convention: the stop string, else the stop token id; None for EOS (or length).
    if stop_str_index >= 0:
        return state.stop[stop_str_index]
    return stop_token_id if stop_token_id >= 0 else None


def _snapshot(
    state: _RequestState,
    finished: bool,
    step: StepInfo | None,
    prompt_logprobs: list[PromptLogprob | None] | None,
    logits: CapturedLogits | None = None,
) -> RequestOutput:
    # A request whose step appended nothing it shows (its tokens held back) shows no sequence.
    shown = finished or bool(state.new)
    outputs = [
        CompletionOutput(seq, *state.new.get(seq.index, (0, ""))) for seq in state.seqs if shown
    ]
    state.new.clear()
    return RequestOutput(
        state.request_id,
        state.prompt,
        state.prompt_token_ids,
        outputs,
        finished,
        step,
        state.first_scheduled_time,
        prompt_logprobs,
        logits,
    )
