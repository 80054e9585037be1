"""How a returned sequence ended, typed once for every renderer: which finish reason, and
for a request the engine ended early, which deadline fired and the message clients see."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from ferrollm._core import SamplingParams
from ferrollm.engine import CompletionOutput

#: Which deadline ended a request: its own ``timeout`` or the server's ``--request-timeout``.
Deadline = Literal["request", "server"]


@dataclass(frozen=True)
class Outcome:
    """A sequence's ending: ``reason`` is the engine's finish reason (None: still running);
    ``message`` is set for an abnormal ending (a deadline or an abort), ``deadline`` for a
    timeout."""

    reason: str | None
    message: str | None = None
    deadline: Deadline | None = None

    @property
    def timed_out(self) -> bool:
        return self.reason == "timeout"

    @classmethod
    def of(cls, c: CompletionOutput, params: SamplingParams) -> Outcome:
        """Sequence ``c``'s outcome; ``params`` are its request's (they say which deadline
        was its own)."""
        reason = c.finish_reason
        if reason == "timeout" and params.timeout_s is None:
            return cls(reason, "request timed out (the server's request_timeout)", "server")
        if reason == "timeout":
            return cls(reason, f"request timed out after {params.timeout_s:g} s", "request")
        if reason == "abort":
            return cls(reason, "request aborted by the server")
        return cls(reason)


def first_abnormal(outcomes: Iterable[Outcome]) -> Outcome | None:
    """The first outcome that carries a message (a deadline or an abort), or None."""
    return next((o for o in outcomes if o.message is not None), None)
