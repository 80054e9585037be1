"""The Databricks Foundation Model API's chat and completions tasks (docs/api/databricks.md):
OpenAI-style ids, its own completion shape and plain usage, ``suffix`` appended
(docs/decisions.md#the-suffix), a deadline decided by ``error_behavior``
(docs/api/databricks.md#error-behavior: "truncate" returns the partial text as "length", "error"
ends a stream with a DEADLINE_EXCEEDED event), errors as events in its error shape, and a message
that is only tool calls with null content."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from msgspec import UNSET

from ferrollm.server.errors import ApiError, ErrorStyle, error_body
from ferrollm.server.http import sse_event
from ferrollm.server.protocol.databricks import DatabricksCompletion, DatabricksCompletionChoice
from ferrollm.server.protocol.openai import CompletionChoice, CompletionUsage, Usage
from ferrollm.server.render.base import Renderer
from ferrollm.server.render.outcome import Outcome, first_abnormal

_ID_PREFIXES = {"chat": "chatcmpl", "completion": "cmpl"}


class DatabricksRenderer(Renderer):
    """The chat and completions tasks of ``/serving-endpoints/{name}/invocations``."""

    calls_only_content = None
    no_tool_calls = UNSET

    def new_id(self, kind: str) -> str:
        return f"{_ID_PREFIXES[kind]}-{uuid.uuid4().hex}"

    def finish_reason(self, outcome: Outcome) -> str | None:
        if outcome.timed_out:
            return "length" if self.truncate else None
        return super().finish_reason(outcome)

    def final_err_msg(self, outcomes: Sequence[Outcome]) -> str | None:
        return None  # a deadline is an event of its own (or, truncated, no error at all)

    def deadline_event(self, outcomes: Sequence[Outcome]) -> bytes | None:
        timed_out = first_abnormal(o for o in outcomes if o.timed_out)
        if timed_out is None or self.truncate:
            return None
        error = ApiError(504, timed_out.message or "request timed out", code="timeout")
        return sse_event(error_body(ErrorStyle.DATABRICKS, error))

    def error_event(self, error: ApiError, stop_chunk: Callable[[], msgspec.Struct]) -> bytes:
        return sse_event(error_body(ErrorStyle.DATABRICKS, error))

    def completion(self, response_id: str, created: int, choices: list[CompletionChoice]) -> Any:
        return DatabricksCompletion(
            id=response_id,
            created=created,
            model=self.model,
            choices=[_choice(c) for c in choices],
        )

    def completion_usage(self, usage: CompletionUsage) -> Any:
        return Usage(usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)

    def suffix(self, suffix: str | None) -> str:
        return suffix or ""


def _choice(c: CompletionChoice) -> DatabricksCompletionChoice:
    choice = DatabricksCompletionChoice(c.index, c.text, c.finish_reason)
    if c.logprobs is not None:
        choice.logprobs = c.logprobs
    return choice
