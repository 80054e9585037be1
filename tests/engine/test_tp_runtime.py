"""The tensor-parallel runtime offline (CPU, gloo): ``LLM(tensor_parallel_size=2)`` vs TP=1.

Rank 0 is this process; its worker is spawned (one node) or started separately with torch's
launcher environment (the two-"node" run). Every run is bounded: the group's collectives time
out after ``TIMEOUT_S``, and subprocesses are waited for with a timeout and killed after.
Greedy tokens must be equal and logprobs within 1e-4 (float32) for a batch that prefills in
chunks, hits the prefix cache and is preempted.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from ferrollm import LLM, SamplingParams
from ferrollm.config import EngineConfig, EngineConfigError
from ferrollm.distributed.launch import GroupError
from ferrollm.engine import EngineRequest, RequestOutput, StepError
from ferrollm.executor.kv_cache import KVCacheSpec
from tiny_models import build_tiny_model

TIMEOUT_S = 30
#: Chunked prefill (8 tokens a step), 4 seats, and 16 blocks of 4 tokens: the batch below
#: prefills in chunks, shares cached prefix blocks and is preempted.
BUSY = {
    "dtype": "float32",
    "quantization": "none",
    "max_num_batched_tokens": 8,
    "block_size": 4,
    "max_num_seqs": 4,
    "kv_cache_memory": 16 * 2048,
    "max_model_len": 48,
}
#: The same 16 blocks at TP=2: each rank stores half the KV heads, so half the bytes.
BUSY_TP2 = {**BUSY, "kv_cache_memory": 8 * 2048}
PREFIX = [5, 17, 29, 41, 53, 65, 77, 89, 101, 113, 125, 137]
PROMPTS = [[*PREFIX, 7 * i + 3, 11 * i + 2, 200 + i] for i in range(5)] + [[9, 8, 7, 6, 5]]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
SCORED = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logprobs=1, prompt_logprobs=2)


@pytest.fixture(scope="module")
def model_dir(tiny_model_factory: Callable[..., Path]) -> Path:
    return tiny_model_factory("llama3")


@pytest.fixture(scope="module")
def expected(model_dir: Path) -> list[RequestOutput]:
    """TP=1: the batch, then the prompt-scored requests, on one engine."""
    llm = LLM(model_dir, **BUSY)
    outputs = llm.generate(PROMPTS, GREEDY) + llm.generate(PROMPTS[:2], SCORED)
    stats = llm.engine.scheduler.stats()
    assert stats["num_preemptions"] > 0 and stats["num_prefix_hit_blocks"] > 0
    return outputs


def assert_same(ours: list[RequestOutput], expected: list[RequestOutput]) -> None:
    assert len(ours) == len(expected)
    for a, b in zip(ours, expected, strict=True):
        (x,), (y,) = a.outputs, b.outputs
        assert x.token_ids == y.token_ids
        assert (x.logprobs is None) == (y.logprobs is None)
        for p, q in zip(x.logprobs or [], y.logprobs or [], strict=True):
            assert p.logprob == pytest.approx(q.logprob, abs=1e-4)
            assert [t for t, _ in p.top] == [t for t, _ in q.top]
            np.testing.assert_allclose([v for _, v in p.top], [v for _, v in q.top], atol=1e-4)
        if b.prompt_logprobs is not None:
            assert a.prompt_logprobs is not None
            got = [p.logprob for p in a.prompt_logprobs if p is not None]
            want = [p.logprob for p in b.prompt_logprobs if p is not None]
            np.testing.assert_allclose(got, want, atol=1e-4)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_tp2_equals_tp1_with_chunked_prefill_prefix_hits_and_preemption(
    model_dir: Path, expected: list[RequestOutput]
) -> None:
    with LLM(model_dir, tensor_parallel_size=2, distributed_timeout=TIMEOUT_S, **BUSY_TP2) as llm:
        workers = llm.engine.driver.workers.processes  # type: ignore[union-attr]
        assert list(workers) == [1]
        ours = llm.generate(PROMPTS, GREEDY) + llm.generate(PROMPTS[:2], SCORED)
        stats = llm.engine.scheduler.stats()
        assert stats["num_preemptions"] > 0 and stats["num_prefix_hit_blocks"] > 0
    assert_same(ours, expected)
    assert workers[1].wait(TIMEOUT_S) == 0  # shut down cleanly by rank 0


def test_tp3_equals_tp1_on_a_model_whose_heads_divide_by_three(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Three ranks (one KV head each, a vocabulary of 320 split into padded thirds) on the
    same busy batch: chunked prefill, prefix-cache hits and preemption."""
    sizes = {"hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 3}
    model = build_tiny_model(
        "llama3", tmp_path_factory.mktemp("six-heads"), sizes={**sizes, "intermediate_size": 192}
    )
    block = KVCacheSpec(2, 3, 16, BUSY["block_size"], torch.float32).bytes_per_block
    tp1 = LLM(model, **{**BUSY, "kv_cache_memory": 16 * block})
    expected = tp1.generate(PROMPTS, GREEDY)
    stats = tp1.engine.scheduler.stats()
    assert stats["num_preemptions"] > 0 and stats["num_prefix_hit_blocks"] > 0
    tp3_options = {**BUSY, "kv_cache_memory": 16 * block // 3}  # a third of the heads a rank
    with LLM(model, tensor_parallel_size=3, distributed_timeout=TIMEOUT_S, **tp3_options) as llm:
        assert sorted(llm.engine.driver.workers.processes) == [1, 2]  # type: ignore[union-attr]
        ours = llm.generate(PROMPTS, GREEDY)
        stats = llm.engine.scheduler.stats()
        assert stats["num_preemptions"] > 0 and stats["num_prefix_hit_blocks"] > 0
    assert_same(ours, expected)


#: /proc/net/tcp{,6} spellings of 127.0.0.1 and ::1.
LOOPBACK = {"0100007F", "00000000000000000000000001000000"}


def listening_addresses(pid: int) -> list[str]:
    """The local addresses (as /proc/net/tcp spells them) process ``pid`` listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as lines:
            next(lines)
            for line in lines:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    found.append(cols[1].split(":")[0])
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_one_node_group_listens_on_loopback_only(model_dir: Path) -> None:
    """The rendezvous store and gloo's pairs of every rank: nothing on another interface."""
    with LLM(model_dir, tensor_parallel_size=2, distributed_timeout=TIMEOUT_S, **BUSY_TP2) as llm:
        worker = llm.engine.driver.workers.processes[1]  # type: ignore[union-attr]
        for pid in (os.getpid(), worker.pid):
            addresses = listening_addresses(pid)
            assert addresses, pid  # rank 0 hosts the store; every rank has gloo listeners
            assert set(addresses) <= LOOPBACK, (pid, addresses)


def test_tp2_runs_the_steps_extras_on_every_rank(model_dir: Path) -> None:
    """A prompt table (embedding overrides) and kept context logits travel with the step."""
    hidden = 64
    table = np.random.default_rng(0).standard_normal((2, hidden)).astype(np.float32)

    def run(llm: LLM) -> tuple[list[int], np.ndarray]:
        engine = llm.engine
        vocab = engine.model_config.vocab_size
        request = EngineRequest.of(
            "ptune",
            [vocab, vocab + 1, *PREFIX],
            SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
        )
        engine.add_request(replace(request, prompt_table=table, return_context_logits=True))
        last = None
        while engine.has_unfinished_requests():
            for output in engine.step():
                last = output
        assert isinstance(last, RequestOutput) and last.finished and last.logits is not None
        assert last.logits.context is not None
        return last.outputs[0].token_ids, last.logits.context

    options = {**BUSY, "kv_cache_memory": "1MiB"}
    tokens, logits = run(LLM(model_dir, **options))
    with LLM(model_dir, tensor_parallel_size=2, distributed_timeout=TIMEOUT_S, **options) as llm:
        tp_tokens, tp_logits = run(llm)
    assert tp_tokens == tokens
    np.testing.assert_allclose(tp_logits, logits, atol=1e-4)


def _launch_rank1(model_dir: Path, port: int, *flags: str) -> subprocess.Popen[bytes]:
    """Rank 1 of a launcher-placed group: ``ferrollm serve`` with RANK=1 runs the worker."""
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": "2",
        "RANK": "1",
    }
    options = [f"--{k.replace('_', '-')}={v}" for k, v in BUSY_TP2.items()]
    command = [sys.executable, "-m", "ferrollm", "serve", str(model_dir), *options]
    command += ["--tensor-parallel-size", "2", "--distributed-timeout", str(TIMEOUT_S)]
    return subprocess.Popen([*command, *flags], stdin=subprocess.DEVNULL, env=env)


@pytest.fixture
def launcher_env(monkeypatch: pytest.MonkeyPatch) -> int:
    """Rank 0's launcher environment (this process); the port of the group's store."""
    port = free_port()
    for name, value in {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": "2",
        "RANK": "0",
    }.items():
        monkeypatch.setenv(name, value)
    return port


def test_two_launcher_placed_nodes_reach_the_same_output(
    model_dir: Path, expected: list[RequestOutput], launcher_env: int
) -> None:
    rank1 = _launch_rank1(model_dir, launcher_env)
    try:
        with LLM(
            model_dir, tensor_parallel_size=2, distributed_timeout=TIMEOUT_S, **BUSY_TP2
        ) as llm:
            assert llm.engine.driver.workers.processes == {}  # type: ignore[union-attr]
            ours = llm.generate(PROMPTS, GREEDY) + llm.generate(PROMPTS[:2], SCORED)
        assert rank1.wait(TIMEOUT_S) == 0
    finally:
        rank1.kill()
        rank1.wait()
    assert_same(ours, expected)


def test_a_worker_with_a_bad_option_is_reported_with_its_rank(
    model_dir: Path, launcher_env: int
) -> None:
    rank1 = _launch_rank1(model_dir, launcher_env, "--block-size", "0")
    try:
        with pytest.raises(GroupError, match=r"rank 1 failed to start: .*block_size"):
            LLM(model_dir, tensor_parallel_size=2, distributed_timeout=TIMEOUT_S, **BUSY_TP2)
        assert rank1.wait(TIMEOUT_S) != 0
    finally:
        rank1.kill()
        rank1.wait()


def test_a_rank_that_never_joins_is_named_after_the_timeout(
    model_dir: Path, launcher_env: int
) -> None:
    with pytest.raises(GroupError, match=r"rank\(s\) \[1\] never joined within 2 s"):
        LLM(model_dir, tensor_parallel_size=2, distributed_timeout=2, **BUSY)


def test_world_size_must_match_tensor_parallel_size(model_dir: Path, launcher_env: int) -> None:
    with pytest.raises(GroupError, match=r"WORLD_SIZE=2 .* `tensor_parallel_size` is 3"):
        LLM(model_dir, tensor_parallel_size=3, **BUSY)


@pytest.mark.parametrize(
    ("options", "field", "message"),
    [
        ({"tensor_parallel_size": 0}, "tensor_parallel_size", "positive integer"),
        ({"tensor_parallel_size": "2"}, "tensor_parallel_size", "positive integer"),
        (
            {"tensor_parallel_size": 2, "task": "embed"},
            "tensor_parallel_size",
            "cannot be used with `task` embed",
        ),
        ({"distributed_timeout": 5}, "distributed_timeout", "needs `tensor_parallel_size` > 1"),
        (
            {"tensor_parallel_size": 2, "compile": "on"},
            "compile",
            "cannot be used with `tensor_parallel_size` > 1",
        ),
        (
            {"tensor_parallel_size": 2, "distributed_timeout": 0},
            "distributed_timeout",
            "> 0",
        ),
    ],
)
def test_parallel_options_are_checked(options: dict[str, object], field: str, message: str) -> None:
    with pytest.raises(EngineConfigError, match=message) as error:
        EngineConfig(**options)  # type: ignore[arg-type]
    assert error.value.field == field


_RECEIVER = """
import sys
import numpy as np
import torch
from ferrollm.distributed.launch import LauncherEnv, connect_store, init_group
from ferrollm.distributed.protocol import Channel, Op

env = LauncherEnv.from_environ()
parallel = init_group(env, connect_store(env, 30, is_master=False), "gloo", 30)
channel = Channel(parallel, torch.device("cpu"))
arrays = {}
for n in range(3):
    op, step = channel.receive()
    arrays[f"{n}.op"] = np.array(int(op))
    if step is None:
        continue
    for name, value in vars(step.plan).items():
        arrays[f"{n}.{name}"] = value
    if step.prompt_targets is not None:
        arrays[f"{n}.targets"] = step.prompt_targets.token_indices
        arrays[f"{n}.target_ids"] = step.prompt_targets.target_ids
        arrays[f"{n}.num_top"] = np.array(step.prompt_targets.num_top)
    if step.keep_logits is not None:
        arrays[f"{n}.keep"] = step.keep_logits.token_indices
    if step.embeds is not None:
        arrays[f"{n}.embed_indices"] = step.embeds.token_indices.numpy()
        arrays[f"{n}.embed_rows"] = step.embeds.rows.numpy()
np.savez(sys.argv[1], **arrays)
# As the worker ends (ferrollm.distributed.worker.exit_now): no gloo teardown.
from ferrollm.distributed.worker import exit_now
exit_now(0)
"""


def test_the_plan_broadcast_rebuilds_every_column_and_extra_on_a_worker(
    tmp_path: Path, launcher_env: int
) -> None:
    """The wire format alone: what rank 0 sends is what a worker rebuilds, array for array."""
    import torch
    import torch.distributed as dist

    from ferrollm.distributed.launch import LauncherEnv, connect_store, init_group
    from ferrollm.distributed.protocol import Channel, Op
    from ferrollm.executor.prompt_logprobs import PromptTargets
    from ferrollm.executor.runner import SyntheticPlan
    from ferrollm.executor.step_extras import EmbeddingOverride, LogitRows

    env = {**os.environ, "RANK": "1"}
    out = tmp_path / "received.npz"
    receiver = subprocess.Popen([sys.executable, "-c", _RECEIVER, str(out)], env=env)
    rng = np.random.default_rng(1)
    plan = SyntheticPlan(
        input_ids=rng.integers(0, 300, 7),
        positions=np.arange(7, dtype=np.int64),
        slot_mapping=rng.integers(0, 99, 7),
        cu_seqlens_q=np.array([0, 5, 7], dtype=np.int32),
        context_lens=np.array([5, 12], dtype=np.int32),
        block_tables=rng.integers(0, 20, (2, 3)).astype(np.int32),
        logits_indices=np.array([4, 6], dtype=np.int64),
        block_copies=np.array([[3, 4]], dtype=np.int32),
    )
    targets = PromptTargets(np.array([0, 1, 2]), np.array([9, 8, 7]), 3)
    keep = LogitRows(np.array([1, 4]))
    embeds = EmbeddingOverride(torch.tensor([0, 2]), torch.randn(2, 64))
    try:
        launcher = LauncherEnv.from_environ()
        assert launcher is not None
        parallel = init_group(launcher, connect_store(launcher, 30, is_master=True), "gloo", 30)
        channel = Channel(parallel, torch.device("cpu"))
        channel.send_step(plan, targets, embeds, keep)
        channel.send_step(plan, None, None, None)
        channel.send_op(Op.SHUTDOWN)
        assert receiver.wait(TIMEOUT_S) == 0
    finally:
        receiver.kill()
        receiver.wait()
        if dist.is_initialized():
            dist.destroy_process_group()
    got = np.load(out)
    for n in (0, 1):
        assert int(got[f"{n}.op"]) == Op.STEP
        for name, value in vars(plan).items():
            assert got[f"{n}.{name}"].dtype == value.dtype, name
            np.testing.assert_array_equal(got[f"{n}.{name}"], value, err_msg=name)
    np.testing.assert_array_equal(got["0.targets"], targets.token_indices)
    np.testing.assert_array_equal(got["0.target_ids"], targets.target_ids)
    assert int(got["0.num_top"]) == 3
    np.testing.assert_array_equal(got["0.keep"], keep.token_indices)
    np.testing.assert_array_equal(got["0.embed_indices"], embeds.token_indices.numpy())
    np.testing.assert_array_equal(got["0.embed_rows"], embeds.rows.numpy())
    assert "1.targets" not in got and "1.keep" not in got and "1.embed_rows" not in got
    assert int(got["2.op"]) == Op.SHUTDOWN


def test_a_hung_worker_fails_the_engine_within_the_timeout(model_dir: Path) -> None:
    options = {**BUSY, "max_model_len": 256, "kv_cache_memory": "1MiB"}
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    llm = LLM(model_dir, tensor_parallel_size=2, distributed_timeout=2, **options)
    (worker,) = llm.engine.driver.workers.processes.values()  # type: ignore[union-attr]
    try:
        worker.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(StepError, match=r"did not answer within 2 s"):
            _generate_until(llm, long, started + TIMEOUT_S)
        assert time.monotonic() - started < 10
        assert worker.wait(TIMEOUT_S) == -signal.SIGKILL  # the broken group's workers are ended
        with pytest.raises(StepError, match="did not answer"):  # and the engine stays failed
            llm.generate(PROMPTS[:1], long)
    finally:
        worker.kill()
        llm.shutdown()


def _generate_until(llm: LLM, params: SamplingParams, deadline: float) -> None:
    """Generate again and again until a call raises or ``deadline`` passes."""
    while time.monotonic() < deadline:
        llm.generate(PROMPTS[:1], params)


def test_a_model_that_cannot_split_fails_every_rank_without_hanging(model_dir: Path) -> None:
    """Every rank refuses the split (4 heads over 3 ranks); rank 0 raises the cause, not a
    timeout, and its workers are gone."""
    started = time.monotonic()
    with pytest.raises(ValueError, match="`tensor_parallel_size` 3 cannot split this model"):
        LLM(model_dir, tensor_parallel_size=3, distributed_timeout=TIMEOUT_S, **BUSY)
    assert time.monotonic() - started < TIMEOUT_S
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline") if _is_our_worker(p)]


def _is_our_worker(cmdline: Path) -> bool:
    """Whether ``/proc/<pid>/cmdline`` is a live tensor-parallel worker this process spawned."""
    try:
        stat = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()
        command = cmdline.read_bytes()
    except OSError:
        return False
    return (
        b"ferrollm.distributed.worker" in command and int(stat[1]) == os.getpid() and stat[0] != "Z"
    )
