"""Drive the scheduler through whole simulated workloads with fake tokens, playing the model
with a shadow KV cache in numpy, and check the invariants from Python after every call."""

from dataclasses import dataclass, field

import numpy as np
import pytest

from ferrollm import NewRequest, SamplingParams, Scheduler, SchedulerConfig, StepPlan

MASK = (1 << 64) - 1


def mix(prev: int, token: int, pos: int) -> int:
    """The shadow model's KV value: depends on the token, its position and the previous value."""
    x = (prev ^ ((token * 0x9E3779B97F4A7C15) & MASK)) & MASK
    x = ((x << 23) | (x >> 41)) & MASK
    return (x + pos + 1) & MASK


def prefix_value(tokens: list[int]) -> int:
    value = 0
    for pos, token in enumerate(tokens):
        value = mix(value, token, pos)
    return value


@dataclass
class ShadowKv:
    """Plays the model runner: copies blocks, writes each token's KV through the plan's slots,
    and reads the previous position through the row's block table, as attention would."""

    num_blocks: int
    block_size: int
    slots: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.slots = [0] * (self.num_blocks * self.block_size)

    def run(self, plan: StepPlan) -> list[int]:
        bs = self.block_size
        for src, dst in plan.block_copies.tolist():
            self.slots[dst * bs : (dst + 1) * bs] = self.slots[src * bs : (src + 1) * bs]
        tables = plan.block_tables
        cu = plan.cu_seqlens_q.tolist()
        ids = plan.input_ids.tolist()
        positions = plan.positions.tolist()
        slot_mapping = plan.slot_mapping.tolist()
        last = []
        for r in range(len(cu) - 1):
            table = tables[r].tolist()

            def slot(pos: int, table: list[int] = table) -> int:
                return table[pos // bs] * bs + pos % bs

            for i in range(cu[r], cu[r + 1]):
                pos = positions[i]
                assert slot(pos) == slot_mapping[i]
                prev = self.slots[slot(pos - 1)] if pos > 0 else 0
                self.slots[slot(pos)] = mix(prev, ids[i], pos)
            last.append(self.slots[slot(int(plan.context_lens[r]) - 1)])
        return last


def check_blocks(s: Scheduler) -> None:
    """Independent of check_invariants(): used blocks are exactly those in running tables."""
    s.check_invariants()
    seqs = s.sequences()
    held = {int(b) for q in seqs for b in q["block_table"].tolist()}
    assert 0 not in held, "the null block is never handed out"
    stats = s.stats()
    assert stats["num_used_blocks"] == len(held)
    assert stats["num_used_blocks"] + stats["num_free_blocks"] == s.num_blocks - 1
    assert all(len(q["block_table"]) == 0 for q in seqs if q["status"] != "running")


def run_workload(seed: int) -> dict[str, int]:
    rng = np.random.default_rng(seed)
    bs = int(rng.integers(1, 9))
    max_model_len = 64
    num_blocks = -(-max_model_len // bs) + 1 + int(rng.integers(0, 48))
    s = Scheduler(
        SchedulerConfig(
            num_blocks=num_blocks,
            block_size=bs,
            max_num_seqs=int(rng.integers(1, 9)),
            max_num_batched_tokens=int(rng.integers(1, 48)),
            max_model_len=max_model_len,
            enable_prefix_caching=bool(rng.random() < 0.8),
            priority_aging_s=float(rng.choice([0.0, 5.0])),
            eos_token_ids=[0],
        )
    )
    kv = ShadowKv(num_blocks, bs)
    prefixes = [rng.integers(1, 5, size=int(rng.integers(1, 24))).tolist() for _ in range(3)]
    num_added = num_finished = num_preempted = num_copies = 0
    now = 0.0
    steps = 0
    while steps < 80 or s.has_unfinished_requests():
        steps += 1
        assert steps < 20_000, f"seed {seed}: no progress"
        now += 1.0
        for _ in range(int(rng.integers(0, 3)) if steps < 80 else 0):
            prompt = (
                prefixes[int(rng.integers(0, 3))]
                + rng.integers(1, 5, size=int(rng.integers(0, 12))).tolist()
            )
            n = int(rng.integers(1, s.max_num_seqs + 1)) if rng.random() < 0.2 else 1
            params = SamplingParams(
                n=n, max_tokens=int(rng.integers(1, 16)), ignore_eos=bool(rng.random() < 0.3)
            )
            deadline = now + float(rng.uniform(1, 30)) if rng.random() < 0.1 else None
            s.add_request(
                NewRequest(
                    num_added,
                    prompt[: max_model_len - 2],
                    params,
                    priority=int(rng.integers(1, 6)),
                    arrival_time=now,
                    deadline=deadline,
                )
            )
            num_added += 1
        if num_added and rng.random() < 0.05:
            s.abort_request(int(rng.integers(0, num_added)))
        plan = s.schedule(now=now)
        check_blocks(s)
        assert plan.num_scheduled_tokens <= s.max_num_batched_tokens
        assert plan.num_rows <= s.max_num_seqs
        tokens = {(q["request_id"], q["seq_index"]): q["token_ids"].tolist() for q in s.sequences()}
        for r, value in enumerate(kv.run(plan)):
            seq_tokens = tokens[(int(plan.req_ids[r]), int(plan.seq_indices[r]))]
            assert value == prefix_value(seq_tokens[: int(plan.context_lens[r])]), (
                f"seed {seed} step {steps} row {r}"
            )
        sampled = rng.integers(0, 6, size=plan.num_samples)
        out = s.update(plan, sampled)
        check_blocks(s)
        assert out.token_ids.tolist() == sampled.tolist()
        num_finished += len(out.finished_req_ids) + len(plan.finished_req_ids)
        num_preempted += len(plan.preempted_req_ids)
        num_copies += len(plan.block_copies)
    assert num_finished == num_added
    assert s.stats()["num_free_blocks"] == num_blocks - 1, (
        "everything finished: every block is free"
    )
    return {
        "preempted": num_preempted,
        "copies": num_copies,
        "hits": s.stats()["num_prefix_hit_blocks"],
    }


def test_simulated_workloads_keep_the_invariants() -> None:
    totals = {"preempted": 0, "copies": 0, "hits": 0}
    for seed in range(40):
        for key, value in run_workload(seed).items():
            totals[key] += value
    assert all(v > 0 for v in totals.values()), totals


@pytest.mark.parametrize("aging", [0.0, 10.0])
def test_admission_order_is_priority_then_arrival(aging: float) -> None:
    s = Scheduler(
        SchedulerConfig(
            num_blocks=64, block_size=4, max_num_seqs=1, max_model_len=32, priority_aging_s=aging
        )
    )
    arrivals = {1: (5, 0.0), 2: (1, 3.0), 3: (3, 1.0), 4: (1, 2.0), 5: (3, 0.5)}
    for rid, (priority, t) in arrivals.items():
        s.add_request(
            NewRequest(rid, [1, 2], SamplingParams(max_tokens=1), priority=priority, arrival_time=t)
        )
    order = []
    while s.has_unfinished_requests():
        plan = s.schedule(now=4.0)
        order += plan.req_ids.tolist()
        s.update(plan, [7] * plan.num_samples)
    assert order == [4, 2, 5, 3, 1]
