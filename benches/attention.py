"""One layer's decode attention on CPU: the SDPA-gather backend against the paged kernel.

SmolLM2 shapes (9 query heads, 3 KV heads, head_dim 64, block 16); decode batches 1/8/32 at
contexts 128/512/2048, each row's blocks scattered at random over the cache; float32 and
bfloat16 (cache and activations). Both sides do the whole per-layer work: write the step's K/V
into the cache, then attend (``prepare`` is per step, shared by all layers, and not timed).
One line per case: median ms per layer call for both, and sdpa / kernel.

Usage: python benches/attention.py [--threads auto|calling|pool] [--min-time S]
                                   [--batches 1 8 32] [--contexts 128 512 2048] [--smoke]
  --threads   where the kernel runs: the backend's choice (default), the calling thread, or
              its pool (torch's OpenMP team, else rayon's; with fewer rows than threads each
              row's keys are split over them; see PagedKernelBackend)
  --smoke     batch 1, context 128, both dtypes, timed briefly: that the bench still runs
              (the test suite runs it)
"""

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch

from ferrollm.layers.attention import TorchSDPABackend
from ferrollm.layers.paged_attention import PagedKernelBackend

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
#: --smoke: the smallest case in each dtype, timed briefly.
SMOKE = {"batches": [1], "contexts": [128], "min_time": 0.01}


class DecodeStep:
    """``batch`` decode rows of ``context`` tokens, blocks drawn at random from the cache."""

    def __init__(self, batch: int, context: int, rng: np.random.Generator) -> None:
        per_row = -(-context // BLOCK)
        self.num_blocks = batch * per_row + 1
        blocks = rng.permutation(np.arange(1, self.num_blocks)).astype(np.int32)
        self.block_tables = blocks.reshape(batch, per_row)
        self.context_lens = np.full(batch, context, dtype=np.int32)
        self.cu_seqlens_q = np.arange(batch + 1, dtype=np.int32)
        self.positions = np.full(batch, context - 1, dtype=np.int64)
        last = self.block_tables[:, (context - 1) // BLOCK].astype(np.int64)
        self.slot_mapping = last * BLOCK + (context - 1) % BLOCK


def median_ms(fn: Callable[[], object], min_time: float) -> float:
    for _ in range(3):
        fn()
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < min_time or len(times) < 5:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def run_case(
    batch: int, context: int, dtype: torch.dtype, parallel: bool | None, min_time: float
) -> tuple[float, float]:
    step = DecodeStep(batch, context, np.random.default_rng(batch * context))
    shape = (step.num_blocks, BLOCK, KV_HEADS, HEAD_DIM)
    cache = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    qkv = torch.randn(batch, HEADS + 2 * KV_HEADS, HEAD_DIM).to(dtype)
    q, k, v = qkv.split([HEADS, KV_HEADS, KV_HEADS], dim=1)
    sdpa, kernel = TorchSDPABackend(), PagedKernelBackend(parallel=parallel)
    sdpa_meta = sdpa.prepare(step, BLOCK, torch.device("cpu"))
    kernel_meta = kernel.prepare(step, BLOCK, torch.device("cpu"))
    scale = HEAD_DIM**-0.5
    return (
        median_ms(lambda: sdpa.forward(q, k, v, cache, sdpa_meta, scale), min_time),
        median_ms(lambda: kernel.forward(q, k, v, cache, kernel_meta, scale), min_time),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", choices=["auto", "calling", "pool"], default="auto")
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--smoke", action="store_true", help="batch 1, context 128, briefly")
    args = parser.parse_args()
    if args.smoke:  # the smallest sizes; flags given still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    parallel = {"auto": None, "calling": False, "pool": True}[args.threads]
    print(f"torch threads {torch.get_num_threads()}, kernel threads: {args.threads}")
    for dtype in (torch.float32, torch.bfloat16):
        for batch in args.batches:
            for context in args.contexts:
                sdpa, kernel = run_case(batch, context, dtype, parallel, args.min_time)
                print(
                    f"decode {str(dtype).removeprefix('torch.'):8} batch {batch:2} "
                    f"context {context:4}: sdpa-gather {sdpa:7.3f} ms  kernel {kernel:7.3f} ms  "
                    f"sdpa/kernel {sdpa / kernel:5.2f}x",
                    flush=True,
                )


if __name__ == "__main__":
    with torch.inference_mode():
        main()
