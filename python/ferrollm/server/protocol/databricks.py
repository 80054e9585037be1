"""Databricks Foundation Model ``/serving-endpoints/{name}/invocations`` bodies
(docs/api/databricks.md).

The chat task answers with the OpenAI chat shapes (`ferrollm.server.protocol.openai`); what
differs is declared here: the requests, the completions response without MindIE's extras, and
the usage without per-step arrays.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET, Struct, UnsetType

from ferrollm.server.protocol.openai import ChatMessage, CompletionLogprobs, Tool, Usage


class DatabricksChatRequest(Struct, kw_only=True):
    """Chat task (docs/api/databricks.md#chat-request)."""

    messages: list[ChatMessage]
    max_tokens: int | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    tool_choice: str | dict[str, Any] | None = None
    tools: list[Tool] | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class DatabricksCompletionRequest(Struct, kw_only=True):
    """Completions task (docs/api/databricks.md#completions-request)."""

    prompt: str | list[str]
    max_tokens: int | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    error_behavior: str | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    suffix: str | None = None
    echo: bool | None = None
    use_raw_prompt: bool | None = None
    #: Not in [DBX]: OpenAI completions logprobs (0..5 alternatives per token); with ``echo``
    #: the prompt's tokens are scored too.
    logprobs: int | None = None


class DatabricksEmbeddingRequest(Struct, kw_only=True):
    """Embeddings task (docs/api/databricks.md#embeddings-task)."""

    input: str | list[str]
    instruction: str | None = None


class DatabricksCompletionChoice(Struct):
    index: int
    text: str
    finish_reason: str | None
    #: Only when the request asked for ``logprobs`` (the OpenAI completions shape).
    logprobs: CompletionLogprobs | UnsetType = UNSET


class DatabricksCompletion(Struct, kw_only=True):
    """Completions task response, or one streamed event
    (docs/api/databricks.md#completions-response)."""

    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[DatabricksCompletionChoice]
    usage: Usage | UnsetType = UNSET
