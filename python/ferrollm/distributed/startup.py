"""One rank's side of start-up: after loading its shard, agree with the others on the KV cache.

Every rank loads its shard and sizes its KV cache from its own memory; then one all-reduce
(MIN) of ``[ok, num_blocks, max_model_len, fingerprint, -fingerprint]`` gives every rank the
same block count (the smallest: every rank stores the same blocks of its own heads, and the
block tables are shared), the context length that count serves, and whether every rank loaded
(a rank that failed wrote its cause to the store first) with the same engine options (the
fingerprint: the MIN of it and of its negation differ when two ranks disagree). Rank 0 waits
for it watching the processes it spawned, so a rank that dies while loading is named at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Store

from ferrollm.config import EngineConfig
from ferrollm.distributed.launch import GroupError, failure_of, report_failure
from ferrollm.distributed.protocol import Channel
from ferrollm.distributed.state import ParallelState
from ferrollm.distributed.worker_runner import WorkerRunner
from ferrollm.executor.kv_cache import KVCache
from ferrollm.executor.runner import CausalLM, ModelRunner
from ferrollm.executor.sizing import KVCachePlan
from ferrollm.layers.attention import AttentionBackend

#: Options every rank must share (the model path may differ between nodes).
_SHARED_OPTIONS = (
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "block_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "speculative",
    "num_speculative_tokens",
    "tensor_parallel_size",
)
#: Stands for "no limit" in the MIN all-reduce (a rank that failed has no plan).
_NO_LIMIT = 2**62


def options_fingerprint(config: EngineConfig) -> int:
    """A 62-bit digest of the options every rank must share."""
    text = repr([getattr(config, name) for name in _SHARED_OPTIONS])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 2


def _no_check() -> None:
    """Nothing to watch (a worker, or rank 0 of a several-node group)."""


@dataclass
class GroupMember:
    """What one rank of a formed group needs at start-up and after."""

    parallel: ParallelState
    store: Store
    channel: Channel
    timeout: float
    fingerprint: int
    #: Raises GroupError if a rank is known to be dead (rank 0 polls its spawned workers).
    watch: Callable[[], None] = field(default=_no_check)

    def make_runner(
        self,
        model: CausalLM,
        kv_cache: KVCache,
        device: torch.device,
        dtype: torch.dtype,
        backend: AttentionBackend | None = None,
    ) -> ModelRunner:
        """A worker's runner: the same collective calls as rank 0's, nothing sampled."""
        return WorkerRunner(model, kv_cache, device, dtype, backend)

    def fail_startup(self, error: BaseException) -> None:
        """This rank could not load: report ``error`` and join the agreement so that no
        other rank waits for it (the caller raises ``error`` afterwards)."""
        report_failure(self.store, self.parallel.rank, error)
        # The others may be gone already; the original error is what matters.
        with contextlib.suppress(Exception):
            self._all_reduce_min([0, _NO_LIMIT, _NO_LIMIT, _NO_LIMIT, _NO_LIMIT])

    def agree(self, kv_plan: KVCachePlan) -> KVCachePlan:
        """The plan every rank uses; raises GroupError naming a rank that failed to start
        (rank 0) or saying that one did (workers), or when the ranks' options differ."""
        ok, blocks, max_len, fp, neg_fp = self._all_reduce_min(
            [1, kv_plan.num_blocks, kv_plan.max_model_len, self.fingerprint, -self.fingerprint]
        )
        if not ok:
            raise GroupError(self._who_failed())
        if fp != -neg_fp:
            raise GroupError(
                "the tensor-parallel ranks were started with different engine options (all of "
                f"{', '.join(_SHARED_OPTIONS)} must be equal on every rank)"
            )
        return replace(kv_plan, num_blocks=blocks, max_model_len=max_len)

    def _who_failed(self) -> str:
        causes = [
            f"tensor-parallel rank {rank} failed to start: {cause}"
            for rank in range(self.parallel.world_size)
            if (cause := failure_of(self.store, rank)) is not None
        ]
        return "; ".join(causes) or "a tensor-parallel rank failed to start"

    def _all_reduce_min(self, values: list[int]) -> list[int]:
        tensor = torch.tensor(values, dtype=torch.int64, device=self.channel.device)
        work = dist.all_reduce(
            tensor, op=dist.ReduceOp.MIN, group=self.parallel.group, async_op=True
        )
        deadline = time.monotonic() + self.timeout
        while not work.is_completed():
            self.watch()
            if time.monotonic() > deadline:
                raise GroupError(
                    f"a tensor-parallel rank did not finish loading within {self.timeout:g} s "
                    "(distributed_timeout)"
                )
            time.sleep(0.02)
        work.wait()
        return [int(v) for v in tensor.cpu().tolist()]
