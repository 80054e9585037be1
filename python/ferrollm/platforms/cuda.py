"""The CUDA platform: Triton paged decode attention, CUDA-graph decode steps, NCCL.

Decode steps attend through ``triton_attention``'s paged kernel and replay captured CUDA graphs
(``cuda_graphs``); prefill and mixed steps run the gathered SDPA path, whose fused kernels
(flash / memory-efficient attention) suit long queries. Without Triton (a torch build that lacks
it) every step runs the gathered SDPA path eagerly.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING

import torch

from ferrollm.executor.buckets import bucket_for, graph_blocker
from ferrollm.layers.attention import AttentionBackend, TorchSDPABackend
from ferrollm.options import EngineConfigError
from ferrollm.platforms.base import MemoryInfo, Platform

if TYPE_CHECKING:
    from ferrollm.executor.kv_cache import KVCache
    from ferrollm.executor.runner import CausalLM, DecodeGraphs

logger = logging.getLogger(__name__)

#: The most rows a captured decode graph takes (the largest bucket); larger steps run eagerly.
MAX_GRAPH_ROWS = 256


class CudaPlatform(Platform):
    """One NVIDIA GPU (the current CUDA device; pick another with CUDA_VISIBLE_DEVICES)."""

    name = "cuda"
    dist_backend = "nccl"
    is_accelerator = True
    preferred_dtype = torch.bfloat16

    @classmethod
    def available(cls) -> bool:
        """Whether torch sees a CUDA device."""
        return bool(torch.cuda.is_available())

    def attention_backend(self) -> AttentionBackend:
        """Triton's paged decode kernel with SDPA for longer queries, or SDPA alone where
        Triton is missing."""
        if importlib.util.find_spec("triton") is None:
            logger.warning("triton is not installed: decode attention gathers its context (slower)")
            return TorchSDPABackend()
        from ferrollm.platforms.triton_attention import TritonPagedBackend

        return TritonPagedBackend()

    def decode_graphs(
        self,
        mode: str,
        model: CausalLM,
        kv_cache: KVCache,
        backend: AttentionBackend,
        max_model_len: int,
        max_num_seqs: int,
    ) -> DecodeGraphs | None:
        """CUDA graphs of the decode step, captured, unless ``mode`` is "off" or they cannot
        run: a backend other than the Triton one (no Triton, latent attention), or a model
        ``graph_blocker`` names (tensor parallelism, a mixture of experts). "auto" then runs
        eagerly; "on" raises EngineConfigError naming ``compile``."""
        from ferrollm.platforms.triton_attention import TritonPagedBackend

        reason = None
        if not isinstance(backend, TritonPagedBackend):
            reason = f"CUDA graphs need the Triton paged attention; this model uses {backend.name}"
        elif (blocker := graph_blocker(model)) is not None:
            reason = f"CUDA graphs cannot run {blocker}"
        if mode == "off" or (mode == "auto" and reason is not None):
            return None
        if reason is not None:
            raise EngineConfigError("compile", f"`compile` on: {reason}")
        assert isinstance(backend, TritonPagedBackend)
        from ferrollm.platforms.cuda_graphs import CudaGraphDecode, fuse_by_default

        max_bucket = bucket_for(min(max_num_seqs, MAX_GRAPH_ROWS))
        assert max_bucket is not None
        max_blocks = -(-max_model_len // kv_cache.block_size)
        graphs = CudaGraphDecode(
            model, kv_cache, backend, max_blocks, max_bucket, fuse=fuse_by_default()
        )
        graphs.warm_up()
        return graphs

    def set_device(self, index: int) -> None:
        """``torch.cuda.set_device`` (NOT RUN with more than one GPU: none was available)."""
        torch.cuda.set_device(index)

    def synchronize(self) -> None:
        """Wait for every queued kernel on the current device."""
        torch.cuda.synchronize()

    def memory_info(self) -> MemoryInfo:
        """Free and total bytes of the current device, as the driver reports them.

        Memory the caching allocator holds (say, after a profiling pass) counts as used.
        """
        free, total = torch.cuda.mem_get_info()
        return MemoryInfo(free=int(free), total=int(total))
