"""What the engine hands back each step: a `RequestOutput` per request that changed, holding
a `CompletionOutput` per output sequence (``engine/tracker.py`` builds them from the
scheduler's columns).

Outputs are snapshots: the engine thread keeps appending to a sequence while another thread
reads an older output, so an output shares the append-only buffers but remembers their lengths,
and its cumulative ``token_ids``/``text``/``logprobs`` never change after it is made.

A request with ``best_of`` > ``n`` (docs/api/openai.md#n-best-of-and-beam-search) runs ``best_of``
candidates and returns the ``n`` with the highest cumulative logprob, best first, as indices 0..n-1:
the scheduler holds the candidates back and ranks them (``rust/sched/behaviour/best_of.rs``). Until
the request finishes, its outputs hold no sequence (they mark the step, for timing); the step that
ends it brings the ``n`` best whole (after an abort or timeout, the best ``n`` of what exists).
Their ``cumulative_logprob`` is the sum of the sampled tokens' logprobs, which the scheduler
computes for these requests even without ``logprobs`` (as vLLM's ``cumulative_logprob``, in the
engine's ``logprobs_mode``: the raw model distribution by default, the one sampled from when
"processed"); logprob entries still reach the caller only if it asked for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ferrollm.engine.captured_logits import CapturedLogits
    from ferrollm.engine.prompt_logprobs import PromptLogprob


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

    def __init__(self, seq: SequenceState, num_new: int, new_text: str) -> None:
        self._seq = seq
        self._num_tokens = len(seq.token_ids)
        self._num_pieces = len(seq.text_pieces)
        self._text: str | None = None
        #: The sequence's place among the returned ones (its rank, for a best_of candidate).
        self.index = seq.index
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
        summed = self._seq.token_logprobs
        if summed is not None:
            return math.fsum(summed[: self._num_tokens])
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
class SequenceState:
    """One sequence's accumulated output (append-only; snapshots read prefixes of it), kept by
    the tracker (``engine/tracker.py``)."""

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
    #: Each token's logprob, kept for ``cumulative_logprob`` when the sequence is a ranked
    #: ``best_of`` candidate (None otherwise).
    token_logprobs: list[float] | None = None

    def release_logprobs(self, text_released: bool) -> list[TokenLogprob] | None:
        """The logprob entries not yet handed out when this step released text, else none
        (they wait); None when the request asked for no logprobs."""
        if self.logprobs is None:
            return None
        if not text_released:
            return []
        start, self.num_released_logprobs = self.num_released_logprobs, len(self.logprobs)
        return self.logprobs[start:]
