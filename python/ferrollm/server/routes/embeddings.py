"""Embeddings: OpenAI ``POST /v1/embeddings`` and the Databricks embeddings task
(docs/api/openai.md#embeddings, docs/api/databricks.md#embeddings-task).

Both validate the body through the Rust validator like every other route (``accept``:
``rust/validate/embeddings.rs``, errors naming the field), tokenize (text inputs get the
model's special tokens, e.g. BERT's [CLS] ... [SEP]), cut to ``truncate_prompt_tokens`` when
asked (keeping the first tokens and the trailing special token, as sentence-transformers
does), check the token limits (``ValidRequest.check_input_tokens``: tokens per input, tokens
per request), and hand the token ids to the embedding engine, whose prefill-only scheduler
packs them into steps. A generation server answers both with 400 (``ServerContext.embedder``).
"""

from __future__ import annotations

import base64

import msgspec
import numpy as np

from ferrollm._core import ValidRequest
from ferrollm.server.context import ServerContext
from ferrollm.server.http import JSONResponse, Request, Response
from ferrollm.server.protocol.embeddings import (
    DatabricksEmbeddingResponse,
    EmbeddingData,
    EmbeddingResponse,
    EmbeddingUsage,
)
from ferrollm.server.routes.common import accept, run_sized


async def embeddings(ctx: ServerContext, request: Request) -> Response:
    """``POST /v1/embeddings``."""
    valid = await accept(ctx, "embeddings", request)
    embedder = ctx.embedder
    inputs = valid.prompts
    e = embedder.embedder
    truncate = valid.truncate_prompt_tokens
    texts = [t for t in inputs if isinstance(t, str)]
    ids: list[list[int]]
    if texts:  # the validator refuses a mix of text and token ids
        ids = await run_sized(sum(map(len, texts)), e.encode, texts)
        if truncate:
            ids = [e.tokenizer.truncate(i, truncate) for i in ids]
    else:
        lists = [i for i in inputs if not isinstance(i, str)]
        ids = [i[:truncate] if truncate else list(i) for i in lists]
    num_tokens = valid.check_input_tokens([len(i) for i in ids])
    vectors = await embedder.embed(ids)
    response = EmbeddingResponse(
        data=_data(vectors, valid.encoding_format),
        model=ctx.model_name,
        usage=EmbeddingUsage(prompt_tokens=num_tokens, total_tokens=num_tokens),
    )
    return JSONResponse(msgspec.json.encode(response))


async def databricks_embeddings(ctx: ServerContext, valid: ValidRequest) -> Response:
    """The Databricks embeddings task: ``input`` (a string or strings) with an optional
    ``instruction`` prepended to each, joined by a space unless it ends in whitespace."""
    embedder = ctx.embedder
    texts = [str(t) for t in valid.prompts]
    instruction = valid.instruction
    if instruction:
        sep = "" if instruction[-1].isspace() else " "
        texts = [f"{instruction}{sep}{text}" for text in texts]
    size = sum(len(t) for t in texts)
    ids = await run_sized(size, embedder.embedder.encode, texts)
    num_tokens = valid.check_input_tokens([len(i) for i in ids])
    vectors = await embedder.embed(ids)
    response = DatabricksEmbeddingResponse(
        id=f"emb-{ctx.next_id()}",
        data=_data(vectors, "float"),
        model=ctx.model_name,
        usage=EmbeddingUsage(prompt_tokens=num_tokens, total_tokens=num_tokens),
    )
    return JSONResponse(msgspec.json.encode(response))


def _data(vectors: np.ndarray, fmt: str) -> list[EmbeddingData]:
    if fmt == "base64":
        rows = vectors.astype("<f4")
        return [
            EmbeddingData(index=i, embedding=base64.b64encode(row.tobytes()).decode())
            for i, row in enumerate(rows)
        ]
    return [EmbeddingData(index=i, embedding=row) for i, row in enumerate(vectors.tolist())]
