"""A tensor-parallel worker (rank > 0): load this rank's shard, then run what rank 0 sends.

``python -m ferrollm.distributed.worker`` is what rank 0 spawns on one node (the engine
options come as JSON in ``FERROLLM_WORKER_OPTIONS``, the rank in torch's launcher environment).
On several nodes, start each rank > 0 with the launcher environment and the same options as rank
0: ``RANK=1 ... ferrollm serve MODEL --tensor-parallel-size N ...`` runs this loop instead of a
server (`run_worker`).

The worker has no scheduler, tokenizer or sampler: it loads its shard, agrees on the KV cache
with the other ranks, then loops on rank 0's messages, running each step through the same
``ModelRunner.run`` call as rank 0 so that the collectives inside the model line up. It exits 0
on ``SHUTDOWN``, and ``EXIT_GROUP_BROKEN`` when rank 0 is gone, a collective fails or times
out, or it cannot start (the cause is written to the store first, for rank 0 to report).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import torch

from ferrollm.config import EngineConfig
from ferrollm.distributed.launch import (
    DEFAULT_TIMEOUT_S,
    EXIT_GROUP_BROKEN,
    WORKER_OPTIONS_ENV,
    GroupError,
    LauncherEnv,
    connect_store,
    init_group,
    ranks_on_this_node,
    report_failure,
    select_device,
    share_cpu_threads,
    timeout_of,
)
from ferrollm.distributed.protocol import Channel, LoRASlotMessage, Op
from ferrollm.distributed.startup import GroupMember, options_fingerprint
from ferrollm.lora.worker import WorkerAdapters
from ferrollm.platforms import Platform, get_platform

logger = logging.getLogger("ferrollm.distributed")


def run_worker(load_config: Callable[[], EngineConfig], *, spawned: bool = False) -> int:
    """Run this process as the launcher environment's rank (> 0) until rank 0 shuts the group
    down; the exit status. ``load_config`` builds the engine options (inside the error
    handling: a bad option is reported to rank 0 with this rank)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if spawned:
        _die_with_parent()
    env = LauncherEnv.from_environ()
    if env is None or env.rank == 0:
        logger.error("a worker needs torch's launcher environment with RANK > 0")
        return 2
    config: EngineConfig | None = None
    try:
        config = load_config()
        env.check(config)
    except Exception as e:
        error: Exception | None = e
    else:
        error = None
    timeout = timeout_of(config) if config is not None else DEFAULT_TIMEOUT_S
    store = connect_store(env, timeout, is_master=False)
    if config is None or error is not None:
        logger.error("tensor-parallel rank %d cannot start: %s", env.rank, error)
        report_failure(store, env.rank, error or "no engine options")
        return EXIT_GROUP_BROKEN
    try:
        platform = get_platform(config.device)
        select_device(platform, env, spawned)
    except Exception as e:  # no such device here: reported before the group forms
        logger.error("tensor-parallel rank %d cannot start: %s", env.rank, e)
        report_failure(store, env.rank, e)
        return EXIT_GROUP_BROKEN
    store.set(f"hello/{env.rank}", "1")
    try:
        return _serve(config, platform, env, store, timeout, spawned)
    except GroupError as e:
        logger.error("tensor-parallel rank %d: %s", env.rank, e)
    except Exception as e:
        logger.error(
            "tensor-parallel rank %d: the group broke (%s: %s)", env.rank, type(e).__name__, e
        )
    return EXIT_GROUP_BROKEN


def _serve(
    config: EngineConfig,
    platform: Platform,
    env: LauncherEnv,
    store: Any,
    timeout: float,
    spawned: bool,
) -> int:
    from ferrollm.engine.build import build_runner
    from ferrollm.executor.loader import load_model_source

    parallel = init_group(env, store, platform.dist_backend, timeout)
    if platform.name == "cpu":
        share_cpu_threads(ranks_on_this_node(env, spawned))
    device = torch.device("cpu") if platform.dist_backend == "gloo" else platform.device
    channel = Channel(parallel, device)
    member = GroupMember(parallel, store, channel, timeout, options_fingerprint(config))
    try:
        config = config.for_platform(platform)
        source = load_model_source(config.model or _default_model(), config.load_format)
    except Exception as e:
        member.fail_startup(e)
        raise
    built = build_runner(config, platform, source, member)
    runner = built.runner
    adapters = WorkerAdapters.of(runner.model, built.lora, config)
    logger.info("tensor-parallel rank %d of %d ready", env.rank, env.world_size)
    while True:
        op, step = channel.receive()
        if op is Op.SHUTDOWN:
            # No destroy_process_group: tearing gloo down while rank 0 still holds its side
            # aborted the process now and then ("terminate called without an active
            # exception", exit -6); the group ends with the process (`exit_now`).
            logger.info("tensor-parallel rank %d: shut down by rank 0", env.rank)
            return 0
        if op is Op.PING:
            channel.answer_ping()
            continue
        if isinstance(step, LoRASlotMessage):
            assert adapters is not None  # rank 0 sends slots only with adapters on
            adapters.load_slot(step.slot, step.name, step.path)
            continue
        assert step is not None
        if adapters is not None and step.lora_slots is not None:
            adapters.state.set_token_slots(torch.from_numpy(step.lora_slots))
        runner.run(step.plan, step.prompt_targets, embeds=step.embeds, keep_logits=step.keep_logits)


def _default_model() -> str:
    from ferrollm.default_model import default_model_path

    return str(default_model_path())


def _die_with_parent() -> None:
    """A spawned worker gets SIGTERM when rank 0 dies, whatever it is doing (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # rank 0 died before prctl took effect
        sys.exit(EXIT_GROUP_BROKEN)


def config_from_env(environ: Mapping[str, str] = os.environ) -> EngineConfig:
    """The engine options rank 0 passed in ``FERROLLM_WORKER_OPTIONS``."""
    return EngineConfig.from_dict(json.loads(environ[WORKER_OPTIONS_ENV]))


def exit_now(code: int) -> NoReturn:
    """End the worker process with ``code``, its logs flushed, without the interpreter's
    teardown (whose destructors would tear the process group down: see `_serve`)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(run_worker(config_from_env, spawned=True))
