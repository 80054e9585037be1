"""Rank 0's side of a tensor-parallel group: forming it, feeding the workers, noticing faults.

`start_driver(config, platform)` forms the group (spawning the workers on one node) and returns
a `Driver`, or None for ``tensor_parallel_size`` 1. Its `DriverRunner` broadcasts each step to
the workers before running it itself. A heartbeat thread polls the spawned workers' processes
(every ``POLL_S``) and every ``PING_S`` pings the group (a broadcast and
a one-element all-reduce), so a worker that dies or hangs is noticed between steps too, and the
workers' receive never waits past the timeout. The first fault is kept in ``Driver.fault``
(naming the rank), every later step fails with it at once, the remaining workers are killed,
and ``on_fault`` is called so that the engine loop ends (the server then exits non-zero).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ferrollm.config import EngineConfig
from ferrollm.distributed.launch import (
    GroupError,
    LauncherEnv,
    Workers,
    connect_store,
    init_group,
    ranks_on_this_node,
    report_failure,
    select_device,
    share_cpu_threads,
    timeout_of,
    wait_for_checkins,
)
from ferrollm.distributed.protocol import Channel, Op
from ferrollm.distributed.startup import GroupMember, options_fingerprint
from ferrollm.executor.kv_cache import KVCache
from ferrollm.executor.prompt_logprobs import PromptTargets
from ferrollm.executor.runner import CausalLM, ModelRunner, StepInputs
from ferrollm.executor.step_extras import EmbeddingOverride, LogitRows
from ferrollm.layers.attention import AttentionBackend
from ferrollm.lora.adapter import LoRAError
from ferrollm.platforms import Platform

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from ferrollm.lora.layers import LoRAState

logger = logging.getLogger("ferrollm.distributed")

#: Seconds between polls of the spawned workers' processes.
POLL_S = 0.2
#: Seconds between pings of the group (at most a quarter of the timeout).
PING_S = 5.0
#: Seconds a failed step waits for a dead worker to show in the poll, to name it.
EXPLAIN_GRACE_S = 1.0


class Driver(GroupMember):
    """Rank 0 of a formed group: the workers, the heartbeat and the group's fault."""

    def __init__(self, member: GroupMember, workers: Workers) -> None:
        super().__init__(**vars(member))
        self.workers = workers
        self.watch = self._check_workers
        #: The first fault of the group (a GroupError naming the rank), or None.
        self.fault: GroupError | None = None
        #: Called once, from the thread that found it, with the fault.
        self.on_fault: Callable[[GroupError], None] = lambda error: None
        #: Held for a whole step or ping: the group's collectives must not interleave.
        self.lock = threading.Lock()
        self._fault_lock = threading.Lock()
        self._last_ping = time.monotonic()
        self._stopping = threading.Event()
        self._heartbeat = threading.Thread(
            target=self._beat, name="ferrollm-tp-heartbeat", daemon=True
        )
        self._closed = False

    def start(self) -> None:
        """Start the heartbeat (after start-up: the group is formed and agreed)."""
        self._last_ping = time.monotonic()
        self._heartbeat.start()
        atexit.register(self.shutdown)

    def make_runner(
        self,
        model: CausalLM,
        kv_cache: KVCache,
        device: torch.device,
        dtype: torch.dtype,
        backend: AttentionBackend | None = None,
    ) -> ModelRunner:
        """The runner of rank 0: each step goes to the workers first."""
        return DriverRunner(self, model, kv_cache, device, dtype, backend)

    def _check_workers(self) -> None:
        self.workers.check(self.store)

    def fail(self, error: BaseException) -> GroupError:
        """Record the group's fault (the first one wins), kill the workers, tell the owner."""
        with self._fault_lock:  # the heartbeat and the engine thread may both find it
            if self.fault is not None:
                return self.fault
            fault = error if isinstance(error, GroupError) else self._explain(error)
            self.fault = fault
        logger.critical("the tensor-parallel group failed: %s", fault)
        self._stopping.set()
        self.workers.kill()
        self.on_fault(fault)
        return fault

    def _explain(self, error: BaseException) -> GroupError:
        # A killed worker's sockets close before its exit can be reaped: give the poll a
        # moment to name the rank and its cause before settling for the collective's error.
        deadline = time.monotonic() + EXPLAIN_GRACE_S
        while True:
            try:
                self._check_workers()
            except GroupError as dead:
                return dead
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL_S / 4)
        if isinstance(error, dist.DistBackendError) or "gloo" in str(error):
            return GroupError(
                f"a tensor-parallel collective failed ({type(error).__name__}: {error}); a "
                f"rank did not answer within {self.timeout:g} s or lost its connection"
            )
        return GroupError(
            f"the step failed on tensor-parallel rank 0 ({type(error).__name__}: {error}); "
            "the other ranks cannot be brought back in step"
        )

    def _beat(self) -> None:
        interval = min(PING_S, self.timeout / 4)
        while not self._stopping.wait(POLL_S):
            try:
                self._check_workers()
                if time.monotonic() - self._last_ping >= interval:
                    self.ping()
            except Exception as e:
                self.fail(e)
                return

    def ping(self) -> None:
        """Ping the group (every rank answers); raises on a failed collective. Steps do not
        count as pings: a step need not wait for every rank."""
        with self.lock:
            if self.fault is not None or self._closed:
                return
            self.channel.send_op(Op.PING)
            self.channel.answer_ping()
            self._last_ping = time.monotonic()

    def load_lora_slot(self, slot: int, name: str, path: Path | None) -> None:
        """Have every worker read adapter ``name`` from ``path`` into ``slot`` (rank 0 just
        did); LoRAError for an adapter with no directory (TensorRT-LLM rows)."""
        if path is None:
            raise LoRAError(
                f"adapter `{name}` came as weights (TensorRT-LLM rows), which the workers of "
                "`tensor_parallel_size` > 1 cannot read: give adapters as directories"
            )
        with self.lock:
            if self.fault is not None:
                raise self.fault
            try:
                self.channel.send_lora_slot(slot, name, str(path))
            except Exception as e:
                raise self.fail(e) from e

    def shutdown(self) -> None:
        """Tell the workers to exit, wait for them, and leave the group (idempotent)."""
        if self._closed:
            return
        self._stopping.set()
        # Bounded: at exit a step may still hold the lock on a thread that will never finish.
        locked = self.lock.acquire(timeout=self.timeout)
        try:
            self._closed = True
            if self.fault is None and locked:
                with contextlib.suppress(Exception):
                    self.channel.send_op(Op.SHUTDOWN)
        finally:
            if locked:
                self.lock.release()
        self.workers.stop(timeout=min(10.0, self.timeout))
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        atexit.unregister(self.shutdown)


class DriverRunner(ModelRunner):
    """`ModelRunner` of rank 0: broadcasts each step before running it (collectively)."""

    def __init__(
        self,
        driver: Driver,
        model: CausalLM,
        kv_cache: KVCache,
        device: torch.device,
        dtype: torch.dtype,
        backend: AttentionBackend | None = None,
    ) -> None:
        super().__init__(model, kv_cache, device, dtype, backend)
        self.driver = driver
        #: The model's LoRA slots, when adapters are on: each step sends its tokens' slots.
        self.lora: LoRAState | None = None

    def run(
        self,
        plan: StepInputs,
        prompt_targets: PromptTargets | None = None,
        *,
        embeds: EmbeddingOverride | None = None,
        keep_logits: LogitRows | None = None,
        positions: npt.NDArray[np.int64] | None = None,
    ) -> torch.Tensor:
        """As `ModelRunner.run`, on every rank; raises the group's GroupError once it broke.
        ``positions`` (M-RoPE) are not sent to the workers: a media model runs on one device
        (the engine refuses tensor parallelism for it)."""
        if positions is not None:
            raise ValueError("M-RoPE positions need a single-device engine")
        driver = self.driver
        with driver.lock:
            if driver.fault is not None:
                raise driver.fault
            try:
                driver.watch()  # a worker that died since the last poll fails this step
                slots = None
                if self.lora is not None:
                    slots = self.lora.token_slots[: len(plan.input_ids)]
                driver.channel.send_step(plan, prompt_targets, embeds, keep_logits, slots)
                logits = super().run(plan, prompt_targets, embeds=embeds, keep_logits=keep_logits)
                driver.watch()
            except Exception as e:
                # The workers ran (or wait in) the same step's collectives: once rank 0 fails
                # mid-step they cannot be brought back in line, so the group is done.
                raise driver.fail(e) from e
        return logits


def start_driver(config: EngineConfig, platform: Platform) -> Driver | None:
    """Form the tensor-parallel group as its rank 0 (None when ``tensor_parallel_size`` is 1).

    Raises GroupError naming the rank and the cause when a worker cannot start or join.
    """
    if config.tensor_parallel_size == 1:
        return None
    timeout = timeout_of(config)
    env = LauncherEnv.from_environ()
    if env is not None:
        env.check(config)
        if env.rank != 0:
            raise GroupError(
                f"this process is tensor-parallel rank {env.rank} (RANK in the environment): "
                "run the worker loop (`ferrollm serve` or `python -m ferrollm.distributed."
                "worker`), not an engine"
            )
        store = connect_store(env, timeout, is_master=True)
        workers = Workers({})
    else:
        local = LauncherEnv("127.0.0.1", 0, config.tensor_parallel_size, 0)
        store = connect_store(local, timeout, is_master=True)
        env = LauncherEnv("127.0.0.1", store.port, config.tensor_parallel_size, 0)
        workers = Workers.spawn(config, env)
    try:
        select_device(platform, env, spawned=bool(workers.processes))
        wait_for_checkins(store, env.world_size, workers, timeout)
        parallel = init_group(env, store, platform.dist_backend, timeout)
    except BaseException as e:
        report_failure(store, 0, e)
        workers.kill()
        raise
    if platform.name == "cpu":
        share_cpu_threads(ranks_on_this_node(env, spawned=bool(workers.processes)))
    device = torch.device("cpu") if platform.dist_backend == "gloo" else platform.device
    member = GroupMember(
        parallel, store, Channel(parallel, device), timeout, options_fingerprint(config)
    )
    logger.info(
        "tensor-parallel group formed: %d ranks over %s (%s)",
        env.world_size,
        platform.dist_backend,
        "spawned on this node" if workers.processes else f"store at {env.master_addr}",
    )
    return Driver(member, workers)
