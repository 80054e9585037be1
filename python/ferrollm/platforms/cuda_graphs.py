"""Decode steps replayed as CUDA graphs: one captured graph per batch-size bucket.

An eager decode step launches every op of every layer from Python, one after another; on a GPU
that host work, not the kernels, bounds small batches. Here each bucket's whole step (embedding,
every layer, final norm, LM head) is captured once at start-up and replayed: a step costs one
launch plus the copy of its inputs.

Shapes are fixed per bucket: the step's columns are copied into static device buffers (through
pinned host staging), rows past the step's own padded as `ferrollm.executor.compiled_decode`
pads them (token 0 at position 0 into the scheduler's null block 0, context 1), block tables
padded to the widest a sequence can have. Attention is `TritonPagedBackend`'s decode kernel,
which reads only each row's ``context_lens`` tokens whatever the table's width, so a graph does
not get slower for a wider table. Steps it cannot take (more rows than the largest bucket,
prefill and mixed steps, prompt logprobs, kept logits, embedding overrides) run eagerly.

A captured graph still runs every small kernel of the eager step (a norm is seven, rotary a
dozen): ~35 launches a layer, a few microseconds each even in a graph. On an H100, batch 1 of
an 8B model replays in 7.9 ms against a 5.0 ms floor for its weights. ``fuse``
(``FERROLLM_CUDA_GRAPH_FUSE=1``; off by default) first compiles the step with inductor, which
fuses those elementwise chains into a few Triton kernels, and captures the compiled step; the
row count stays symbolic, so one compile serves every bucket, and a failed compile falls back
to capturing the eager step (logged). It is off because it has not yet run on a GPU: its one
try there failed in the paged kernel's float types under inductor (fixed since, not rerun).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ferrollm.executor.buckets import BUCKETS, bucket_for
from ferrollm.layers.attention import AttentionContext
from ferrollm.platforms.triton_attention import DecodeMetadata, TritonPagedBackend

if TYPE_CHECKING:
    from ferrollm.executor.kv_cache import KVCache
    from ferrollm.executor.runner import CausalLM, StepInputs

logger = logging.getLogger(__name__)

#: Eager runs of a bucket before its capture (Triton's compile, cuBLAS's workspace).
WARM_UP_RUNS = 2


def fuse_by_default() -> bool:
    """``FERROLLM_CUDA_GRAPH_FUSE`` ("0", the default, or "1"): compile the step before capture."""
    value = os.environ.get("FERROLLM_CUDA_GRAPH_FUSE", "0")
    if value not in ("0", "1"):
        raise ValueError(f"FERROLLM_CUDA_GRAPH_FUSE must be 0 or 1; got {value!r}")
    return value == "1"


@dataclass(frozen=True)
class Captured:
    """A captured graph: ``replay`` reruns its kernels, which rewrite ``output`` in place."""

    replay: Callable[[], None]
    output: torch.Tensor


def capture(forward: Callable[[], torch.Tensor], pool: Any) -> Captured:
    """Run ``forward`` a few times eagerly on a side stream (Triton compiles, cuBLAS sets up),
    then capture one run of it as a CUDA graph in ``pool``."""
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARM_UP_RUNS):
            forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        output = forward()
    torch.cuda.synchronize()
    return Captured(replay=graph.replay, output=output)


class CudaGraphDecode:
    """Decode steps of up to ``max_bucket`` rows through captured CUDA graphs.

    ``max_blocks`` is the widest block table a sequence can have
    (``ceil(max_model_len / block_size)``). Call `warm_up` once before `run`.
    """

    def __init__(
        self,
        model: CausalLM,
        kv_cache: KVCache,
        backend: TritonPagedBackend,
        max_blocks: int,
        max_bucket: int,
        fuse: bool = False,
    ) -> None:
        self.model = model
        #: The step compiled by inductor (``fuse``), or None: the eager step is captured.
        self._compiled: Callable[..., torch.Tensor] | None = None
        if fuse:
            self._compiled = torch.compile(self._step, dynamic=False, fullgraph=True)
        self.kv_cache = kv_cache
        self.backend = backend
        self.max_blocks = max_blocks
        self.buckets = tuple(b for b in BUCKETS if b <= max_bucket)
        self.max_rows = self.buckets[-1] if self.buckets else 0
        device = kv_cache.device
        rows = self.max_rows

        pinned = device.type == "cuda"

        def pair(
            shape: tuple[int, ...], dtype: torch.dtype, fill: int = 0
        ) -> tuple[torch.Tensor, torch.Tensor]:
            host = torch.full(shape, fill, dtype=dtype, pin_memory=pinned)
            return host, torch.full(shape, fill, dtype=dtype, device=device)

        self._ids = pair((rows,), torch.int64)
        self._positions = pair((rows,), torch.int64)
        self._slots = pair((rows,), torch.int64)
        # Context 1 until a step fills them: the capture's warm-up runs attend over one token
        # (none would be 0/0, and NaN written into the null block meets padded gathers later).
        self._lens = pair((rows,), torch.int32, fill=1)
        self._tables = pair((rows, max_blocks), torch.int32)
        self._graphs: dict[int, Captured] = {}

    def accepts(self, plan: StepInputs) -> bool:
        """Whether ``plan`` is a decode step of at most ``max_rows`` rows whose block tables
        fit ``max_blocks``."""
        num_tokens = len(plan.input_ids)
        return (
            0 < num_tokens <= self.max_rows
            and len(plan.cu_seqlens_q) - 1 == num_tokens
            and plan.block_tables.shape[1] <= self.max_blocks
        )

    def run(self, plan: StepInputs) -> torch.Tensor:
        """Logits ``[plan.num_samples, vocab]`` (model dtype, a view of the graph's output,
        valid until the next replay) of an accepted step; call under
        ``torch.inference_mode()``."""
        n = len(plan.input_ids)
        bucket = bucket_for(n)
        assert bucket is not None and bucket in self._graphs
        self._stage(self._ids, plan.input_ids, n, bucket)
        self._stage(self._positions, plan.positions, n, bucket)
        self._stage(self._slots, plan.slot_mapping, n, bucket)
        self._stage(self._lens, plan.context_lens, n, bucket, fill=1)
        host, dev = self._tables
        width = plan.block_tables.shape[1]
        host[:bucket].zero_()
        host[:n, :width].numpy()[:] = plan.block_tables
        dev[:bucket].copy_(host[:bucket], non_blocking=True)
        graph = self._graphs[bucket]
        graph.replay()
        logits = graph.output
        indices = plan.logits_indices
        if len(indices) == n and bool((indices == np.arange(n)).all()):
            return logits[:n]
        return logits.index_select(0, torch.from_numpy(indices).to(logits.device))

    def warm_up(self) -> None:
        """Capture every bucket's graph, the largest first (the graphs share one memory pool,
        which the largest sizes), logging the time."""
        pool = torch.cuda.graph_pool_handle()
        for bucket in sorted(self.buckets, reverse=True):
            start = time.perf_counter()
            with torch.inference_mode():
                try:
                    graph = capture(functools.partial(self._forward, bucket), pool)
                except Exception:
                    if self._compiled is None:
                        raise
                    logger.exception("the fused decode step failed; capturing the eager one")
                    self._compiled = None
                    graph = capture(functools.partial(self._forward, bucket), pool)
            self._graphs[bucket] = graph
            logger.info(
                "CUDA graph for %d decode rows (%s) captured in %.2f s",
                bucket,
                "eager" if self._compiled is None else "fused by inductor",
                time.perf_counter() - start,
            )

    def _forward(self, bucket: int) -> torch.Tensor:
        inputs = tuple(
            buffers[1][:bucket]
            for buffers in (self._ids, self._positions, self._slots, self._tables, self._lens)
        )
        if self._compiled is None:
            return self._step(*inputs)
        for t in inputs:  # the row count stays symbolic: one compile serves every bucket
            torch._dynamo.maybe_mark_dynamic(t, 0)
        return self._compiled(*inputs)

    def _step(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
    ) -> torch.Tensor:
        metadata = DecodeMetadata(
            slot_mapping=slot_mapping,
            block_tables=block_tables,
            context_lens=context_lens,
            sliding_window=self.model.sliding_window,
        )
        windowed = {w: replace(metadata, sliding_window=w) for w in self.model.layer_windows}
        ctx = AttentionContext(self.backend, metadata, self.kv_cache.layers, windowed)
        hidden = self.model(input_ids, positions, ctx)
        return self.model.compute_logits(hidden)

    @staticmethod
    def _stage(
        buffers: tuple[torch.Tensor, torch.Tensor],
        values: np.ndarray,
        n: int,
        bucket: int,
        fill: int = 0,
    ) -> None:
        """Copy ``values`` (n of them) into the pinned host buffer, pad to ``bucket`` with
        ``fill``, and queue the copy to the device buffer."""
        host, dev = buffers
        view = host.numpy()
        view[:n] = values
        view[n:bucket] = fill
        dev[:bucket].copy_(host[:bucket], non_blocking=True)
