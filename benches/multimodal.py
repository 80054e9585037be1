"""One-image chat requests against text-only requests of the same prompt length, and the
encoder cache's effect on a repeated image, on the SmolVLM demo checkpoint.

In-process, through `AsyncEngine` (the server's engine, without HTTP: the server's own cost is
benches/request_path.py's business), prefix caching off so every request runs its whole
prefill. The model is the SmolVLM demo (`ferrollm make-smolvlm-demo`; ``--model DIR``, else
``~/.cache/ferrollm/smolvlm-demo``, built there first if missing, as ``make smolvlm-demo``
does): SmolLM2-135M's decoder and a small seeded vision tower.

An image request is a chat with one distinct noise image (a 1 x 2 grid of tiles plus the
global tile), processed as the server processes one (tiles, placeholder expansion,
tokenization, on a worker thread) and encoded at its prefill; its TTFT counts all of that. The
text request has the same token ids with every image-related token replaced by a word, so both
prefill the same number of tokens. ``--requests`` of each run ``--concurrency`` at a time; one
line per concurrency: requests/s and TTFT p50 of each kind.

The encoder-cache line sends the same image ``--requests`` times one after another, with the
cache on (after one warm-up, every tile hits) and off (``capacity_bytes = 0``: every tile
encoded again), and prints TTFT p50 of each.

Usage: python benches/multimodal.py [--model DIR] [--concurrency 1 8] [--requests 16]
                                    [--max-tokens 16] [--dtype auto] [--threads N]
       python benches/multimodal.py --smoke

``--smoke``: concurrency 1 and 2, 2 requests of 2 tokens each, the demo built in a temporary
directory unless the cache already holds it: that the bench still runs (the test suite runs
it).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ferrollm import SamplingParams
from ferrollm.config import EngineConfig
from ferrollm.engine import AsyncEngine, EngineRequest
from ferrollm.media.items import ImageMedia
from ferrollm.multimodal.demo import ADDED_TOKENS, build_smolvlm_demo, is_built
from ferrollm.multimodal.inputs import ProcessedPrompt

CACHE_DIR = Path.home() / ".cache" / "ferrollm" / "smolvlm-demo"
QUESTION = "Describe this picture in one sentence."
#: Image-related token ids (the demo's added tokens) become this word's id in text requests.
FILLER_WORD = " the"


def noise_image(seed: int) -> Image.Image:
    """A 90 x 200 seeded noise picture (3 tiles: a 1 x 2 grid plus the global tile)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (90, 200, 3), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB")


class Bench:
    """The engine, the rendered chat prompt, and the two kinds of request."""

    def __init__(self, engine: AsyncEngine, max_tokens: int) -> None:
        self.engine = engine
        processor = engine.multimodal
        assert processor is not None, "the model takes no images"
        self.processor = processor
        messages = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}
        ]
        self.prompt = engine.tokenizer.apply_chat_template(messages)
        self.params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        (filler,) = engine.tokenizer.encode(FILLER_WORD, False)
        # The image, tile and marker tokens (each one id) are words in the text requests.
        markers = {engine.tokenizer.encode(token, False)[0] for token in ADDED_TOKENS}
        image_ids = self._process(noise_image(0)).prompt_token_ids
        self.text_ids = [filler if i in markers else i for i in image_ids]
        self.image_tokens = sum(1 for i in image_ids if i in markers)

    def _process(self, image: Image.Image) -> ProcessedPrompt:
        media = [ImageMedia(image, "png", image.width, image.height)]
        return self.processor.process(self.prompt, media, add_special_tokens=False)

    async def image_request(self, image: Image.Image) -> float:
        """TTFT (s) of a chat with ``image``: processing on a thread, then the engine."""
        start = time.perf_counter()
        processed = await asyncio.to_thread(self._process, image)
        request = dataclasses.replace(
            EngineRequest.of(self.engine.new_request_id(), processed.prompt_token_ids, self.params),
            media=processed.media,
        )
        return await self._run(request, start)

    async def text_request(self) -> float:
        start = time.perf_counter()
        request = EngineRequest.of(self.engine.new_request_id(), self.text_ids, self.params)
        return await self._run(request, start)

    async def _run(self, request: EngineRequest, start: float) -> float:
        first = None
        async for output in self.engine.generate(request):
            if first is None and output.outputs[0].token_ids:
                first = time.perf_counter() - start
        assert first is not None
        return first


async def closed_loop(
    make: Callable[[int], Awaitable[float]], requests: int, concurrency: int
) -> tuple[float, float]:
    """``requests`` calls of ``make(i)``, ``concurrency`` at a time: (requests/s, TTFT p50 ms)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> float:
        async with gate:
            return await make(i)

    start = time.perf_counter()
    ttfts = await asyncio.gather(*(one(i) for i in range(requests)))
    elapsed = time.perf_counter() - start
    return requests / elapsed, 1000 * statistics.median(ttfts)


async def run(bench: Bench, args: argparse.Namespace) -> None:
    # Warm-up: both paths once (first-call allocations, the encoder's first pass).
    await bench.image_request(noise_image(10_000))
    await bench.text_request()
    seed = 1
    for concurrency in args.concurrency:
        images = [noise_image(seed + i) for i in range(args.requests)]  # distinct: no cache hits
        seed += args.requests
        image_rps, image_ttft = await closed_loop(
            lambda i, images=images: bench.image_request(images[i]), args.requests, concurrency
        )
        text_rps, text_ttft = await closed_loop(
            lambda i: bench.text_request(), args.requests, concurrency
        )
        print(
            f"multimodal conc={concurrency} requests={args.requests} image {image_rps:.2f} req/s "
            f"ttft_p50 {image_ttft:.1f} ms | text {text_rps:.2f} req/s ttft_p50 {text_ttft:.1f} ms "
            f"(prompt {len(bench.text_ids)} tokens, {bench.image_tokens} image-related, "
            f"{args.max_tokens} out)",
            flush=True,
        )
    cache = bench.engine.engine.encoder_cache
    assert cache is not None
    repeated = noise_image(2**31)
    await bench.image_request(repeated)  # now cached
    hits = cache.hits
    _, on_ttft = await closed_loop(lambda i: bench.image_request(repeated), args.requests, 1)
    hits = cache.hits - hits
    capacity = cache.capacity_bytes
    cache.capacity_bytes = 0
    misses = cache.misses
    _, off_ttft = await closed_loop(lambda i: bench.image_request(repeated), args.requests, 1)
    misses = cache.misses - misses
    cache.capacity_bytes = capacity
    print(
        f"multimodal encoder_cache repeated_image requests={args.requests} on ttft_p50 "
        f"{on_ttft:.1f} ms (tile hits {hits}) | off ttft_p50 {off_ttft:.1f} ms "
        f"(tile encodes {misses}), saves {off_ttft - on_ttft:.1f} ms",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.concurrency, args.requests, args.max_tokens = [1, 2], 2, 2
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            model = CACHE_DIR
            if not is_built(model):
                model = Path(scratch) / "smolvlm-demo" if args.smoke else CACHE_DIR
                print(f"building the SmolVLM demo into {model}", flush=True)
                build_smolvlm_demo(model)
        config = EngineConfig(
            model=str(model),
            dtype=args.dtype,
            device="cpu",
            enable_prefix_caching=False,
            max_num_seqs=max(args.concurrency),
            kv_cache_memory="512MiB",
        )
        engine = AsyncEngine.from_config(config)
        try:
            bench = Bench(engine, args.max_tokens)
            dtype = str(engine.engine.runner.dtype).removeprefix("torch.")
            print(f"model {model} dtype {dtype} threads {torch.get_num_threads()}", flush=True)
            asyncio.run(run(bench, args))
        finally:
            engine.shutdown()


if __name__ == "__main__":
    main()
