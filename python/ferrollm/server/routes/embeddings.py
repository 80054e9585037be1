"""Embeddings: OpenAI ``POST /v1/embeddings`` and the Databricks embeddings task (SPEC 6.7).

Both tokenize (text inputs get the model's special tokens, e.g. BERT's [CLS] ... [SEP]),
check the limits (inputs per request, tokens per input, tokens per request), and hand the
token ids to the embedding engine, which packs them into steps. An input longer than the
model's maximum is a 400 unless the request asks to truncate (``truncate_prompt_tokens``);
truncation keeps the first tokens and the trailing special token, as sentence-transformers
does. A generation server answers both with 400 (``ServerContext.embedder``).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from ferrollm.engine.embed_async import AsyncEmbedder
from ferrollm.server.context import ServerContext
from ferrollm.server.errors import bad_request
from ferrollm.server.http import JSONResponse, Request, Response
from ferrollm.server.protocol.embeddings import (
    MAX_EMBED_INPUTS,
    MAX_EMBED_TOTAL_TOKENS,
    DatabricksEmbeddingResponse,
    EmbeddingData,
    EmbeddingResponse,
    EmbeddingUsage,
)
from ferrollm.server.routes.common import accept, decode_body, run_sized

_OPENAI_FIELDS = frozenset(
    ("model", "input", "encoding_format", "dimensions", "user", "truncate_prompt_tokens")
)
_FORMATS = ("float", "base64")


async def embeddings(ctx: ServerContext, request: Request) -> Response:
    """``POST /v1/embeddings``."""
    embedder = ctx.embedder
    body = decode_body(request.body)
    unknown = sorted(set(body) - _OPENAI_FIELDS)
    if unknown:
        raise bad_request(
            f"unknown field `{unknown[0]}`; /v1/embeddings takes "
            + ", ".join(sorted(_OPENAI_FIELDS)),
            param=unknown[0],
            code="unknown_field",
        )
    model = body.get("model")
    if not isinstance(model, str):
        raise bad_request(f"`model` is required and must be a string; got {model!r}", "model")
    ctx.check_model(model)
    fmt = body.get("encoding_format", "float")
    if fmt not in _FORMATS:
        raise bad_request(
            f"`encoding_format` must be float or base64; got {fmt!r}", "encoding_format"
        )
    _check_dimensions(body.get("dimensions"), embedder.embedder.dimensions)
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise bad_request(f"`user` must be a string; got {body['user']!r}", "user")
    limit = ctx.limits.max_input_tokens
    truncate = _truncate_tokens(body.get("truncate_prompt_tokens"), limit)
    ids = await _tokenized(embedder, body.get("input"), truncate)
    num_tokens = _check_lengths(ids, limit, "input", truncatable=True)
    vectors = await embedder.embed(ids)
    response = EmbeddingResponse(
        data=_data(vectors, fmt),
        model=ctx.model_name,
        usage=EmbeddingUsage(prompt_tokens=num_tokens, total_tokens=num_tokens),
    )
    return JSONResponse(msgspec.json.encode(response))


async def databricks_embeddings(
    ctx: ServerContext, request: Request, body: dict[str, Any]
) -> Response:
    """The Databricks embeddings task: ``input`` (a string or strings) with an optional
    ``instruction`` prepended to each, joined by a space unless it ends in whitespace."""
    embedder = ctx.embedder
    accept(ctx, "databricks_embeddings", body)
    texts = [body["input"]] if isinstance(body["input"], str) else list(body["input"])
    _check_count(len(texts), "input")
    instruction = body.get("instruction")
    if instruction:
        sep = "" if instruction[-1].isspace() else " "
        texts = [f"{instruction}{sep}{text}" for text in texts]
    size = sum(len(t) for t in texts)
    ids = await run_sized(size, embedder.embedder.encode, texts)
    num_tokens = _check_lengths(ids, ctx.limits.max_input_tokens, "input", truncatable=False)
    vectors = await embedder.embed(ids)
    response = DatabricksEmbeddingResponse(
        id=f"emb-{ctx.next_id()}",
        data=_data(vectors, "float"),
        model=ctx.model_name,
        usage=EmbeddingUsage(prompt_tokens=num_tokens, total_tokens=num_tokens),
    )
    return JSONResponse(msgspec.json.encode(response))


def _check_dimensions(value: object, dimensions: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_request(f"`dimensions` must be a positive integer; got {value!r}", "dimensions")
    if value != dimensions:
        raise bad_request(
            f"`dimensions` {value} is not supported: this model gives {dimensions}-dimensional "
            "embeddings and was not trained for shortening (Matryoshka); leave `dimensions` out "
            f"or send {dimensions}",
            "dimensions",
            code="unsupported",
        )


def _truncate_tokens(value: object, limit: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not (value == -1 or value >= 1):
        raise bad_request(
            f"`truncate_prompt_tokens` must be -1 (the model's maximum) or a positive integer; "
            f"got {value!r}",
            "truncate_prompt_tokens",
        )
    if value > limit:
        raise bad_request(
            f"`truncate_prompt_tokens` must be at most {limit} (the model's input limit); "
            f"got {value}",
            "truncate_prompt_tokens",
        )
    return limit if value == -1 else value


async def _tokenized(
    embedder: AsyncEmbedder, value: object, truncate: int | None
) -> list[list[int]]:
    """The token ids of ``input``: text (one string or a list) or token ids (one list of ints
    or a list of such lists), each checked."""
    e = embedder.embedder
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise bad_request(
            "`input` must be a non-empty string, a non-empty list of strings, a list of token "
            f"ids or a list of token-id lists; got {_kind(value)}",
            "input",
        )
    _check_count(len(value), "input")
    if all(isinstance(v, str) for v in value):
        for i, text in enumerate(value):
            if not text:
                raise bad_request(f"`input[{i}]` must not be empty", f"input[{i}]")
        ids = await run_sized(sum(map(len, value)), e.encode, value)
        return [e.tokenizer.truncate(i, truncate) for i in ids] if truncate else ids
    lists = [value] if all(_is_token(v) for v in value) else value
    vocab = e.tokenizer.vocab_size
    for i, ids in enumerate(lists):
        _check_token_ids(ids, vocab, f"input[{i}]" if lists is value else "input")
    return [list(ids[:truncate]) if truncate else list(ids) for ids in lists]


def _check_token_ids(ids: object, vocab: int, param: str) -> None:
    if not isinstance(ids, list) or not ids or not all(_is_token(t) for t in ids):
        raise bad_request(
            f"`{param}` must be a non-empty string or a non-empty list of token ids (integers); "
            f"got {_kind(ids)} (a list mixing strings and token ids is not accepted)",
            param,
        )
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise bad_request(
            f"`{param}` has token id {bad}, outside the vocabulary [0, {vocab})", param
        )


def _check_count(count: int, param: str) -> None:
    if count > MAX_EMBED_INPUTS:
        raise bad_request(
            f"`{param}` has {count} inputs; at most {MAX_EMBED_INPUTS} per request", param
        )


def _check_lengths(ids: Sequence[Sequence[int]], limit: int, param: str, truncatable: bool) -> int:
    """The request's token count, after checking each input and the total."""
    for i, one in enumerate(ids):
        if len(one) > limit:
            hint = "; send `truncate_prompt_tokens` to cut it" if truncatable else ""
            raise bad_request(
                f"`{param}[{i}]` has {len(one)} tokens; the model takes at most {limit}{hint}",
                f"{param}[{i}]",
                code="too_long",
            )
    total = sum(map(len, ids))
    if total > MAX_EMBED_TOTAL_TOKENS:
        raise bad_request(
            f"`{param}` has {total} tokens in all; at most {MAX_EMBED_TOTAL_TOKENS} per request",
            param,
            code="too_long",
        )
    return total


def _data(vectors: np.ndarray, fmt: str) -> list[EmbeddingData]:
    if fmt == "base64":
        rows = vectors.astype("<f4")
        return [
            EmbeddingData(index=i, embedding=base64.b64encode(row.tobytes()).decode())
            for i, row in enumerate(rows)
        ]
    return [EmbeddingData(index=i, embedding=row) for i, row in enumerate(vectors.tolist())]


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: object) -> str:
    if isinstance(value, list):
        return "an empty list" if not value else "a list of " + type(value[0]).__name__
    return type(value).__name__
