"""Tensor-parallel test runs: the same steps on one process and on a gloo group of several.

`run_cases` loads each case's model for this rank (``ferrollm.engine.build.load_model`` with a
`ParallelState`), builds a paged KV cache of the rank's local KV heads, and runs a prefill of
two prompts in one step, then decode steps fed the greedy tokens of rank 0 (broadcast, as the
engine will). Rank 0 records hidden states and logits; every rank records the bytes it read.

`run_group` starts ``world_size`` processes of this file (``python tp_support.py``) on a free
loopback port, each writing its results with ``torch.save``; a single-process reference runs in
the test's own process with ``SINGLE``. A case with ``adapters`` (PEFT directories) runs them
in LoRA slots 0.., prompt row ``i`` on slot ``row_slots[i]`` (-1 = the base model).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ferrollm.distributed.state import SINGLE, ParallelState
from ferrollm.engine.build import load_model
from ferrollm.executor.kv_cache import KVCache
from ferrollm.executor.loader import load_model_source
from ferrollm.executor.runner import ModelRunner, SyntheticPlan
from ferrollm.lora.adapter import load_peft_adapter
from ferrollm.lora.layers import LoRAState, attach_lora

CPU = torch.device("cpu")
BLOCK_SIZE = 4
PROMPTS = ([5, 17, 42, 99, 3, 250, 8], [300, 11, 64, 7, 128])
NUM_DECODE_STEPS = 3
_TIMEOUT_S = 120
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def run_cases(cases: list[dict[str, Any]], parallel: ParallelState) -> dict[str, Any]:
    """``{case name: {"hidden": [...], "logits": [...], "bytes": int}}`` for this rank;
    a case that fails records ``{"error": message}`` (every rank fails it alike)."""
    results: dict[str, Any] = {}
    for case in cases:
        try:
            results[case["name"]] = _run_case(case, parallel)
        except ValueError as err:
            results[case["name"]] = {"error": str(err)}
    return results


def _run_case(case: dict[str, Any], parallel: ParallelState) -> dict[str, Any]:
    source = load_model_source(case["path"])
    dtype = _DTYPES[case.get("dtype", "float32")]
    model = load_model(source, CPU, dtype, case.get("quantization"), parallel)
    spec = model.kv_cache_spec(BLOCK_SIZE, dtype)
    blocks_per_seq = -(-(max(map(len, PROMPTS)) + NUM_DECODE_STEPS) // BLOCK_SIZE)
    tables = np.arange(1, 1 + blocks_per_seq * len(PROMPTS), dtype=np.int32).reshape(
        len(PROMPTS), -1
    )
    runner = ModelRunner(model, KVCache(spec, 1 + tables.size, CPU), CPU, dtype)
    lora = _attach_adapters(model, case)
    hidden_steps, logits_steps = [], []
    tokens = [list(p) for p in PROMPTS]
    new = [list(p) for p in PROMPTS]  # the tokens each row feeds this step
    for _ in range(1 + NUM_DECODE_STEPS):
        plan = _plan(tokens, new, tables)
        if lora is not None:  # row i on slot case["row_slots"][i]
            counts = [len(fresh) for fresh in new]
            lora.set_token_slots(
                torch.tensor(case["row_slots"]).repeat_interleave(torch.tensor(counts))
            )
        with torch.inference_mode():
            hidden = runner.hidden_states(plan)
            logits = model.compute_logits(hidden[torch.from_numpy(plan.logits_indices)])
        hidden_steps.append(hidden.float().clone())
        logits_steps.append(logits.float().clone())
        chosen = _greedy(logits, parallel)
        new = [[int(t)] for t in chosen]
        for row, token in zip(tokens, chosen, strict=True):
            row.append(int(token))
    return {
        "hidden": hidden_steps,
        "logits": logits_steps,
        "bytes": source.num_bytes_read,
        "num_local_kv_heads": model.num_local_kv_heads,
    }


def _attach_adapters(model: Any, case: dict[str, Any]) -> LoRAState | None:
    """The case's PEFT ``adapters`` (paths) in slots 0.., or None without any."""
    if not case.get("adapters"):
        return None
    state = attach_lora(model, len(case["adapters"]), case["max_lora_rank"])
    for slot, path in enumerate(case["adapters"]):
        state.load_slot(
            slot, load_peft_adapter(f"a{slot}", Path(path), model, case["max_lora_rank"])
        )
    return state


def _greedy(logits: torch.Tensor, parallel: ParallelState) -> torch.Tensor:
    """Rank 0's argmax, the same on every rank."""
    chosen = (
        logits.argmax(-1) if parallel.is_driver else torch.zeros(len(PROMPTS), dtype=torch.int64)
    )
    if parallel.world_size > 1:
        dist.broadcast(chosen, src=0, group=parallel.group)
    return chosen


def _plan(tokens: list[list[int]], new: list[list[int]], tables: np.ndarray) -> SyntheticPlan:
    """One step: each row feeds ``new`` (the tail of its ``tokens``)."""
    ids: list[int] = []
    positions, slots = [], []
    cu, ctx = [0], []
    for row, (seq, fresh) in enumerate(zip(tokens, new, strict=True)):
        start = len(seq) - len(fresh)
        pos = np.arange(start, len(seq))
        ids += fresh
        positions.append(pos)
        slots.append(tables[row][pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
        cu.append(cu[-1] + len(fresh))
        ctx.append(len(seq))
    cu_arr = np.array(cu, dtype=np.int32)
    return SyntheticPlan(
        input_ids=np.array(ids, dtype=np.int64),
        positions=np.concatenate(positions).astype(np.int64),
        slot_mapping=np.concatenate(slots).astype(np.int64),
        cu_seqlens_q=cu_arr,
        context_lens=np.array(ctx, dtype=np.int32),
        block_tables=tables,
        logits_indices=(cu_arr[1:] - 1).astype(np.int64),
        block_copies=np.zeros((0, 2), dtype=np.int32),
    )


def run_single(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """The reference: every case on one process."""
    return run_cases(cases, SINGLE)


def run_group(cases: list[dict[str, Any]], world_size: int, out: Path) -> list[dict[str, Any]]:
    """Every case on a gloo group of ``world_size`` processes; each rank's results."""
    port = _free_port()
    spec = json.dumps(cases)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(rank), str(world_size), str(port), spec, str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(world_size)
    ]
    logs = [p.communicate(timeout=_TIMEOUT_S)[0].decode(errors="replace") for p in procs]
    for rank, (proc, log) in enumerate(zip(procs, logs, strict=True)):
        if proc.returncode != 0:
            raise AssertionError(f"rank {rank} exited {proc.returncode}:\n{log[-4000:]}")
    return [torch.load(out / f"rank{rank}.pt") for rank in range(world_size)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _main(rank: int, world_size: int, port: int, spec: str, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        parallel = ParallelState(rank, world_size, dist.group.WORLD)
        torch.save(run_cases(json.loads(spec), parallel), Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    # Results saved and the group gone: leave without running C++ static destructors, where a
    # library's still-joinable thread has aborted the process at exit now and then ("terminate
    # called without an active exception", rank 0 exiting -6 after finishing its work).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    _main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
