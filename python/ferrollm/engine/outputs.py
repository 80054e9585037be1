"""What the engine hands back each step: `RequestOutput`s, and the tracker that builds them.

The scheduler reports a step as flat columns (one entry per sample); `RequestTracker` turns them
into one `RequestOutput` per request that changed, accumulating each sequence's tokens, text and
logprobs. Outputs are snapshots: the engine thread keeps appending to a sequence while another
thread reads an older output, so an output shares the append-only buffers but remembers their
lengths, and its cumulative ``token_ids``/``text``/``logprobs`` never change after it is made.

A request with ``best_of`` > ``n`` (SPEC 5.3) runs ``best_of`` candidates and returns the ``n``
with the highest cumulative logprob, best first, as indices 0..n-1. The candidates stay hidden
until the request finishes: until then its outputs hold no sequence (they mark the step, for
timing), and a candidate that ends early is kept here (its KV blocks are already freed) until
the last one ends. An abort or timeout ends the request with the best ``n`` of what exists. The
cumulative logprob is the sum of the sampled tokens' logprobs, which the scheduler computes for
these requests even without ``logprobs`` (as vLLM's ``cumulative_logprob``, in the engine's
``logprobs_mode``: the raw model distribution by default, the one sampled from when
"processed"); logprob entries still reach the caller only if it asked for them.
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
from ferrollm.engine.prompt_logprobs import PromptLogprob, PromptLogprobBook
from ferrollm.engine.prompt_tables import PromptTableBook

if TYPE_CHECKING:
    from ferrollm.engine.request import EngineRequest


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """The logprob of one generated token and its best alternatives (best first), with the
    bytes each token stands for (from the step that made them)."""

    token_id: int
    logprob: float
    #: ``(token id, logprob)`` of each alternative.
    top: tuple[tuple[int, float], ...] = ()
    #: The bytes the token stands for (OpenAI's ``bytes``).
    token_bytes: bytes = b""
    #: The bytes of each alternative in ``top``, in order.
    top_bytes: tuple[bytes, ...] = ()

    @property
    def text(self) -> str:
        """The token's text: its bytes decoded, a partial character as U+FFFD."""
        return self.token_bytes.decode("utf-8", "replace")

    @property
    def top_texts(self) -> tuple[str, ...]:
        """The text of each alternative in ``top``."""
        return tuple(b.decode("utf-8", "replace") for b in self.top_bytes)


class CompletionOutput:
    """One output sequence of a request as of one step (an immutable snapshot).

    ``new_*`` are what this step added; ``token_ids``, ``text`` and ``logprobs`` everything so
    far. ``new_logprobs`` are the entries of the tokens whose text this step released: the
    logprobs of a token whose text is held back (half a character, a possible stop string)
    wait for the step that releases it, so a streamed chunk carries its own tokens' logprobs.
    ``finish_reason`` is "stop", "length", "abort" or "timeout" once the sequence ended;
    ``stop_reason`` is then the stop string or stop token id that ended it (None for EOS).
    """

    __slots__ = (
        "_num_pieces",
        "_num_tokens",
        "_seq",
        "_text",
        "finish_reason",
        "index",
        "new_logprobs",
        "new_text",
        "new_token_ids",
        "score",
        "stop_reason",
    )

    def __init__(
        self, seq: _SequenceState, num_new: int, new_text: str, index: int | None = None
    ) -> None:
        self._seq = seq
        self._num_tokens = len(seq.token_ids)
        self._num_pieces = len(seq.text_pieces)
        self._text: str | None = None
        #: The sequence's place among the returned ones (its rank, for a best_of candidate).
        self.index = seq.index if index is None else index
        self.new_token_ids = seq.token_ids[self._num_tokens - num_new : self._num_tokens]
        self.new_text = new_text
        self.finish_reason = seq.finish_reason
        self.stop_reason = seq.stop_reason
        #: Beam search: the hypothesis's score, ``sum of its tokens' processed logprobs /
        #: len(token_ids) ** length_penalty`` (HF's ``sequences_scores``); else None.
        self.score = seq.score
        self.new_logprobs = seq.release_logprobs(bool(new_text) or self.finish_reason is not None)

    @property
    def token_ids(self) -> list[int]:
        """Every generated token id so far."""
        return self._seq.token_ids[: self._num_tokens]

    @property
    def text(self) -> str:
        """Every piece of generated text so far (stop strings and hold-back applied)."""
        if self._text is None:
            self._text = "".join(self._seq.text_pieces[: self._num_pieces])
        return self._text

    @property
    def logprobs(self) -> list[TokenLogprob] | None:
        """Per generated token, when the request asked for logprobs; else None."""
        lps = self._seq.logprobs
        return None if lps is None else lps[: self._num_tokens]

    @property
    def cumulative_logprob(self) -> float | None:
        """Sum of the generated tokens' logprobs, when the request asked for logprobs or
        ranked ``best_of`` candidates by it."""
        ranked = self._seq.token_logprobs
        if ranked is not None:
            return math.fsum(ranked[: self._num_tokens])
        lps = self.logprobs
        return None if lps is None else math.fsum(lp.logprob for lp in lps)

    @property
    def finished(self) -> bool:
        """Whether this sequence has ended."""
        return self.finish_reason is not None

    def __repr__(self) -> str:
        return (
            f"CompletionOutput(index={self.index}, text={self.text!r}, "
            f"token_ids={self.token_ids}, finish_reason={self.finish_reason!r})"
        )


@dataclass(frozen=True)
class RequestFailure:
    """A request ended by an error instead of finishing; its stream raises ``error``."""

    request_id: str
    error: Exception


@dataclass(frozen=True, slots=True)
class StepInfo:
    """The engine step an output came from: when it ran (``time.perf_counter()`` seconds,
    the clock of ``RequestOutput.first_scheduled_time``) and how many sequences it ran."""

    started: float
    finished: float
    num_seqs: int


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """One request's state after a step: every output sequence, by index. For ``best_of`` >
    ``n``, ``outputs`` stays empty until the request finishes, then holds the best ``n``."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    #: True once every sequence has ended; the request's last output.
    finished: bool
    #: The step that produced this output (None for an output made outside a step).
    step: StepInfo | None = None
    #: When a step first scheduled the request (``time.perf_counter()``), if one has.
    first_scheduled_time: float | None = None
    #: Per prompt token when the request asked for ``prompt_logprobs``: its score (None for
    #: the first token, which nothing comes before); None when it did not ask.
    prompt_logprobs: list[PromptLogprob | None] | None = None
    #: The raw logits the request asked to keep (``return_context_logits`` /
    #: ``return_generation_logits``), shared and filled as it runs; None when it asked none.
    logits: CapturedLogits | None = None

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens in the prompt."""
        return len(self.prompt_token_ids)


@dataclass(slots=True)
class _SequenceState:
    """One sequence's accumulated output (append-only; snapshots read prefixes of it)."""

    index: int
    token_ids: list[int] = field(default_factory=list)
    text_pieces: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    #: Beam search: the hypothesis's score (set with its last token).
    score: float | None = None
    #: Logprob entries already handed out with their text.
    num_released_logprobs: int = 0
    #: Each token's logprob, kept to rank best_of candidates (None when not ranked).
    token_logprobs: list[float] | None = None

    def ranking_key(self) -> tuple[float, int]:
        """Sorts the best candidate first: highest cumulative logprob, then lowest index (a
        NaN sum, from tokens given without logits, ranks last)."""
        total = math.fsum(self.token_logprobs or ())
        return (-total if total == total else math.inf, self.index)

    def release_logprobs(self, text_released: bool) -> list[TokenLogprob] | None:
        """The logprob entries not yet handed out when this step released text, else none
        (they wait); None when the request asked for no logprobs."""
        if self.logprobs is None:
            return None
        if not text_released:
            return []
        start, self.num_released_logprobs = self.num_released_logprobs, len(self.logprobs)
        return self.logprobs[start:]


@dataclass(slots=True)
class _RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    #: ``params.stop``, read once (the property builds a new list each time).
    stop: list[str]
    seqs: list[_SequenceState]
    #: per sequence index: (tokens added, text added) this step.
    new: dict[int, tuple[int, str]] = field(default_factory=dict)
    first_scheduled_time: float | None = None
    #: best_of > n: the sequences are candidates, ranked when the request finishes.
    ranks: bool = False


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
        ranks = params.best_of > params.n and not params.use_beam_search
        seqs = [
            _SequenceState(
                i, logprobs=[] if logprobs else None, token_logprobs=[] if ranks else None
            )
            for i in range(params.best_of if ranks else params.n)
        ]
        state = _RequestState(
            request.request_id,
            request.prompt,
            request.prompt_token_ids.tolist(),
            params,
            params.stop,
            seqs,
            ranks=ranks,
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

    def deliver(
        self, plan: StepPlan, out: StepOutput, step: StepInfo | None = None
    ) -> list[RequestOutput | RequestFailure]:
        """One output per request that changed in the step of ``plan``; finished ones end.

        A request that failed alone in the step (``out.failed_req_ids``) gets a
        `RequestFailure` (a ValueError with the scheduler's message) and is forgotten.
        """
        if step is not None:
            self._note_scheduled(plan, step.started)
        touched: dict[int, _RequestState] = {}
        ended = plan.finished_req_ids.tolist()
        for internal_id, code in zip(ended, plan.finished_reasons.tolist(), strict=True):
            self._end_request(internal_id, FINISH_REASON_NAMES[code], touched)
        if len(out):
            self._append(_Columns.of(out), out.text, touched)
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
        for internal_id, message in zip(
            out.failed_req_ids.tolist(), out.failed_messages, strict=True
        ):
            state = self._states.get(internal_id)
            if state is not None:
                failures.append(RequestFailure(state.request_id, ValueError(message)))
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
    if state.ranks:
        outputs = _best(state) if finished else []
    else:
        outputs = [CompletionOutput(seq, *state.new.get(seq.index, (0, ""))) for seq in state.seqs]
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


def _best(state: _RequestState) -> list[CompletionOutput]:
    """The ``n`` best candidates, best first, as indices 0..n-1; all of each is new (nothing
    of them was shown before)."""
    best = sorted(state.seqs, key=_SequenceState.ranking_key)[: state.params.n]
    return [
        CompletionOutput(seq, len(seq.token_ids), "".join(seq.text_pieces), index=rank)
        for rank, seq in enumerate(best)
    ]
