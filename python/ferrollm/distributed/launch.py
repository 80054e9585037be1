"""Forming the process group: where the ranks come from, how they meet, how start-up fails.

Two ways to place the ranks:

* one node (no launcher environment): rank 0, the process that serves, starts a TCP store on
  127.0.0.1 on a free port and spawns ``tensor_parallel_size - 1`` workers
  (``python -m ferrollm.distributed.worker``) with torch's launcher environment pointing at it;
  the workers get the engine options as JSON in ``FERROLLM_WORKER_OPTIONS`` and talk over
  loopback only;
* several nodes: torch's launcher environment (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``,
  ``RANK``) is already set on every node; nothing is spawned. Rank 0 runs ``ferrollm serve``
  (it hosts the store at ``MASTER_ADDR:MASTER_PORT``), every other rank runs the worker loop:
  ``ferrollm serve MODEL --tensor-parallel-size N ...`` with ``RANK`` > 0 (the same options on
  every node) or ``python -m ferrollm.distributed.worker``.

Start-up is checked in two places. Before the group forms, each worker writes ``hello/<rank>``
to the store, or ``failed/<rank>`` with the cause when it cannot even read its options; rank 0
waits for all of them, watching the processes it spawned, for at most the timeout. After every
rank has loaded its shard, one all-reduce (``ferrollm.distributed.startup``) tells every rank
whether all of them succeeded; a rank that failed wrote its cause to the store first, so rank 0
names the rank and the cause.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# The store types (torch.distributed re-exports them without declaring it to type checkers).
from torch._C._distributed_c10d import Store, TCPStore

from ferrollm.config import EngineConfig
from ferrollm.distributed.state import ParallelState
from ferrollm.platforms import Platform

logger = logging.getLogger("ferrollm.distributed")

#: Where a spawned worker finds the engine options (JSON of ``EngineConfig.to_dict()``).
WORKER_OPTIONS_ENV = "FERROLLM_WORKER_OPTIONS"
#: ``distributed_timeout`` when the config gives none.
DEFAULT_TIMEOUT_S = 300.0
#: A worker's exit status when the group broke (rank 0 gone, a collective failed) or it failed
#: to start; rank 0 (the server) exits with ``EXIT_ENGINE_DEAD`` instead.
EXIT_GROUP_BROKEN = 71
_LAUNCHER_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")


class GroupError(RuntimeError):
    """The tensor-parallel group failed: a rank died, hung, or could not start."""


@dataclass(frozen=True)
class LauncherEnv:
    """torch's launcher environment: where the store is, and this process's rank."""

    master_addr: str
    master_port: int
    world_size: int
    rank: int

    @classmethod
    def from_environ(
        cls, environ: os._Environ[str] | dict[str, str] = os.environ
    ) -> LauncherEnv | None:
        """The launcher environment, or None when none of its variables is set; raises
        GroupError when only some are, or one is not a number."""
        present = [name for name in _LAUNCHER_VARS if name in environ]
        if not present:
            return None
        if len(present) != len(_LAUNCHER_VARS):
            missing = sorted(set(_LAUNCHER_VARS) - set(present))
            raise GroupError(
                f"torch's launcher environment is incomplete: {', '.join(present)} set but "
                f"{', '.join(missing)} missing"
            )
        try:
            env = cls(
                environ["MASTER_ADDR"],
                int(environ["MASTER_PORT"]),
                int(environ["WORLD_SIZE"]),
                int(environ["RANK"]),
            )
        except ValueError as e:
            raise GroupError(f"torch's launcher environment is not valid: {e}") from None
        if not 0 <= env.rank < env.world_size:
            raise GroupError(f"RANK must be in [0, WORLD_SIZE={env.world_size}); got {env.rank}")
        return env

    def check(self, config: EngineConfig) -> None:
        """Raise GroupError unless ``WORLD_SIZE`` is the configured tensor-parallel size."""
        if self.world_size != config.tensor_parallel_size:
            raise GroupError(
                f"WORLD_SIZE={self.world_size} in the launcher environment but "
                f"`tensor_parallel_size` is {config.tensor_parallel_size}"
            )


def launcher_rank() -> int | None:
    """``RANK`` of the launcher environment, or None when there is none (or it is broken:
    rank 0's start-up then reports it)."""
    try:
        env = LauncherEnv.from_environ()
    except GroupError:
        return None
    return None if env is None else env.rank


def timeout_of(config: EngineConfig) -> float:
    """The collective timeout in seconds."""
    return float(config.distributed_timeout or DEFAULT_TIMEOUT_S)


def connect_store(env: LauncherEnv, timeout: float, *, is_master: bool) -> TCPStore:
    """The group's rendezvous store at ``MASTER_ADDR:MASTER_PORT`` (hosted by rank 0).

    Rank 0 listens on ``MASTER_ADDR`` only (loopback on one node): torch's own store server
    would listen on every interface, so it gets a socket bound here instead. Port 0 picks a
    free port (``store.port`` tells which).
    """
    listener = _listen(env.master_addr, env.master_port) if is_master else None
    port = env.master_port if listener is None else listener.getsockname()[1]
    return TCPStore(
        env.master_addr,
        port,
        env.world_size,
        is_master,
        timedelta(seconds=timeout),
        wait_for_workers=False,
        master_listen_fd=None if listener is None else listener.detach(),
    )


def _listen(address: str, port: int) -> socket.socket:
    """A listening TCP socket bound to ``address:port`` (its fd goes to the store)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((address, port))
        listener.listen(128)
    except OSError as e:
        listener.close()
        raise GroupError(
            f"rank 0 cannot listen on MASTER_ADDR:MASTER_PORT = {address}:{port} ({e})"
        ) from e
    return listener


def init_group(env: LauncherEnv, store: Store, backend: str, timeout: float) -> ParallelState:
    """Join the default process group; this rank's `ParallelState`."""
    if backend == "gloo" and env.master_addr in ("127.0.0.1", "localhost"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one node: loopback only
    dist.init_process_group(
        backend,
        store=store,
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(seconds=timeout),
    )
    return ParallelState(env.rank, env.world_size, dist.group.WORLD)


def select_device(platform: Platform, env: LauncherEnv, spawned: bool) -> None:
    """Make this rank's accelerator the current device (``cuda``/``npu`` without an index then
    means it): the rank on one node, ``LOCAL_RANK`` on several. Call before loading anything.
    NOT RUN with more than one GPU or on any NPU (none was available)."""
    local = str(env.rank) if spawned else os.environ.get("LOCAL_RANK", "0")
    platform.set_device(int(local) if local.isdigit() else 0)


def share_cpu_threads(ranks_here: int) -> None:
    """On CPU, give each of the ``ranks_here`` ranks of this node its share of the cores (each
    would otherwise start a thread per core), unless OMP_NUM_THREADS says otherwise."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    threads = max(1, (os.cpu_count() or 1) // ranks_here)
    torch.set_num_threads(threads)
    logger.info("CPU tensor parallelism: %d torch threads for this rank", threads)


def ranks_on_this_node(env: LauncherEnv, spawned: bool) -> int:
    """All ranks when rank 0 spawned them here; else the launcher's ``LOCAL_WORLD_SIZE``."""
    if spawned:
        return env.world_size
    local = os.environ.get("LOCAL_WORLD_SIZE", "1")
    return int(local) if local.isdigit() and int(local) > 0 else 1


def report_failure(store: Store, rank: int, cause: BaseException | str) -> None:
    """Tell rank 0 why this rank cannot go on (read back by `failure_of`)."""
    text = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
    try:
        store.set(f"failed/{rank}", text[:4000])
    except Exception:  # the store is gone too: rank 0 sees the exit or the timeout
        logger.exception("rank %d could not report its failure", rank)


def failure_of(store: Store, rank: int) -> str | None:
    """The cause rank ``rank`` reported, if any."""
    try:
        if store.check([f"failed/{rank}"]):
            cause: bytes = store.get(f"failed/{rank}")
            return cause.decode(errors="replace")
    except Exception:
        return None
    return None


class Workers:
    """The worker processes rank 0 spawned (none on several nodes), and their health."""

    def __init__(self, processes: dict[int, subprocess.Popen[bytes]]) -> None:
        self.processes = processes

    @classmethod
    def spawn(cls, config: EngineConfig, env: LauncherEnv) -> Workers:
        """Start ranks 1..world_size-1 of a one-node group on this machine."""
        options = json.dumps(config.to_dict())
        processes = {}
        for rank in range(1, env.world_size):
            child_env = {
                **os.environ,
                "MASTER_ADDR": env.master_addr,
                "MASTER_PORT": str(env.master_port),
                "WORLD_SIZE": str(env.world_size),
                "RANK": str(rank),
                WORKER_OPTIONS_ENV: options,
            }
            processes[rank] = subprocess.Popen(
                [sys.executable, "-m", "ferrollm.distributed.worker"],
                stdin=subprocess.DEVNULL,
                env=child_env,
            )
            logger.info("spawned tensor-parallel rank %d (pid %d)", rank, processes[rank].pid)
        return cls(processes)

    def dead(self) -> list[tuple[int, int, int]]:
        """(rank, pid, exit status) of each spawned worker that has exited."""
        return [
            (rank, p.pid, p.returncode)
            for rank, p in self.processes.items()
            if p.poll() is not None
        ]

    def check(self, store: Store | None = None) -> None:
        """Raise GroupError naming the first spawned worker that has exited (with the cause
        it reported in ``store``, if any)."""
        for rank, pid, status in self.dead():
            cause = None if store is None else failure_of(store, rank)
            reported = f": {cause}" if cause else ""
            raise GroupError(
                f"tensor-parallel rank {rank} (pid {pid}) {describe_exit(status)}{reported}"
            )

    def stop(self, timeout: float = 10.0) -> None:
        """Wait up to ``timeout`` s for the workers to exit, then kill what is left."""
        deadline = time.monotonic() + timeout
        for process in self.processes.values():
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def kill(self) -> None:
        """SIGKILL every worker still running (the group is broken: none can go on)."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait()


def describe_exit(status: int) -> str:
    """``exited with status 3`` / ``was killed by SIGKILL``."""
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


def wait_for_checkins(store: Store, world_size: int, workers: Workers, timeout: float) -> None:
    """Rank 0, before the group forms: wait until every worker said hello; raise GroupError
    naming the rank that reported a failure, exited, or never came within ``timeout``."""
    deadline = time.monotonic() + timeout
    waiting = set(range(1, world_size))
    while waiting:
        for rank in sorted(waiting):
            cause = failure_of(store, rank)
            if cause is not None:
                raise GroupError(f"tensor-parallel rank {rank} failed to start: {cause}")
            if store.check([f"hello/{rank}"]):
                waiting.discard(rank)
        workers.check(store)
        if waiting and time.monotonic() > deadline:
            raise GroupError(
                f"tensor-parallel rank(s) {sorted(waiting)} never joined within {timeout:g} s "
                "(distributed_timeout)"
            )
        if waiting:
            time.sleep(0.05)
