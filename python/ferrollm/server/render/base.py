"""`Renderer`: what differs between the APIs that share the chat and completions handlers,
behind one interface (finish reasons, ids, the events that end a stream, the shapes of a
completion and of a tool-only message). The handlers build chunks and responses from these
and never ask which API they serve."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from ferrollm.server.context import ServerContext
from ferrollm.server.errors import ApiError
from ferrollm.server.protocol.openai import Completion, CompletionChoice, CompletionUsage
from ferrollm.server.render.outcome import Outcome, first_abnormal


class Renderer(ABC):
    """One API's rendering of a request's outputs, built per request."""

    #: MindIE's timing fields (``prefill_time``, ``decode_time_arr``) on responses.
    timings: bool = False
    #: A message that is only tool calls has this ``content`` ("" or None).
    calls_only_content: str | None = ""
    #: ``tool_calls`` of a message that made none (None, or unset: left out).
    no_tool_calls: Any = None
    #: Whether chat messages split reasoning out into ``reasoning_content`` (an API whose
    #: documents have no such field keeps it in the text).
    splits_reasoning: bool = False

    def __init__(
        self, ctx: ServerContext, *, truncate: bool = False, lora: str | None = None
    ) -> None:
        self.ctx = ctx
        #: Databricks ``error_behavior: "truncate"``: a deadline returns the partial text.
        self.truncate = truncate
        #: The LoRA adapter the request's model name selected (`ServerContext.select_model`).
        self.lora = lora
        #: The ``model`` responses name: the adapter's, else the served model's.
        self.model = lora or ctx.model_name

    @property
    def full_text(self) -> bool:
        """Stream cumulative text (MindIE ``fullTextEnabled``)."""
        return False

    @property
    def offsets_across_choices(self) -> bool:
        """Completions ``text_offset`` counts on across choices (MindIE's whole responses)."""
        return False

    @abstractmethod
    def new_id(self, kind: str) -> str:
        """A response id for a ``kind`` ("chat" or "completion") response."""

    def finish_reason(self, outcome: Outcome) -> str | None:
        """The response's finish reason (docs/api/common.md#finish-reasons): an early end is
        "stop"."""
        if outcome.reason is None:
            return None
        return "length" if outcome.reason == "length" else "stop"

    def final_err_msg(self, outcomes: Sequence[Outcome]) -> str | None:
        """``err_msg`` on the last chunk of a stream (or the whole response) whose request
        ended early, else None."""
        abnormal = first_abnormal(outcomes)
        return None if abnormal is None else abnormal.message

    def deadline_event(self, outcomes: Sequence[Outcome]) -> bytes | None:
        """An event ending a stream after its last chunk because a deadline fired (None:
        the last chunk says it)."""
        return None

    @abstractmethod
    def error_event(self, error: ApiError, stop_chunk: Callable[[], msgspec.Struct]) -> bytes:
        """The event that ends a stream an error cut short; ``stop_chunk`` builds the
        route's own empty "stop" chunk."""

    def completion(self, response_id: str, created: int, choices: list[CompletionChoice]) -> Any:
        """A completions response (or streamed chunk) of ``choices``."""
        return Completion(id=response_id, created=created, model=self.model, choices=choices)

    def completion_usage(self, usage: CompletionUsage) -> Any:
        """The usage a completions response carries."""
        return usage

    def suffix(self, suffix: str | None) -> str:
        """Text appended to every finished completion."""
        return ""
