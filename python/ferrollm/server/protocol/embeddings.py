"""Embeddings bodies: OpenAI ``POST /v1/embeddings`` and the Databricks embeddings task's
response (docs/api/openai.md#embeddings, docs/api/databricks.md#embeddings-task). Requests are
validated by the Rust validator (``validate("embeddings", ...)``, ``rust/validate/embeddings.rs``);
these Structs encode responses and document both routes in OpenAPI."""

from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct


class EmbeddingRequest(Struct, kw_only=True):
    """OpenAI ``POST /v1/embeddings`` (and vLLM's ``truncate_prompt_tokens``)."""

    model: str
    #: A string, a list of strings, a list of token ids or a list of token-id lists.
    input: str | list[Any]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    #: vLLM extra: cut each input to this many tokens (-1: the model's maximum) instead of
    #: refusing a longer one.
    truncate_prompt_tokens: int | None = None


class EmbeddingData(Struct, kw_only=True):
    """One input's vector: floats, or base64 of little-endian float32 bytes."""

    index: int
    embedding: list[float] | str
    object: str = "embedding"


class EmbeddingUsage(Struct, kw_only=True):
    """Tokens embedded (special tokens and a Databricks ``instruction`` included)."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(Struct, kw_only=True):
    """The OpenAI response."""

    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
    object: str = "list"


class DatabricksEmbeddingResponse(Struct, kw_only=True):
    """The Databricks embeddings task's response (docs/api/databricks.md#embeddings-task: an ``id``,
    no ``created``)."""

    id: str
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
    object: str = "list"
