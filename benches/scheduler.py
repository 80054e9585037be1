"""Steady-decode scheduler step driven from Python through the bindings: what the engine pays
per step (schedule() + update() with a numpy array of sampled tokens). One line per batch size.

Usage: python benches/scheduler.py [--steps N] [--repeats N] [--smoke]
  --smoke   5 steps, 1 repeat: that the bench still runs (the test suite runs it)
"""

import argparse
import time

import numpy as np

from ferrollm import NewRequest, SamplingParams, Scheduler, SchedulerConfig

PROMPT_LEN = 256
#: --smoke: every batch size, a handful of steps.
SMOKE = {"steps": 5, "repeats": 1}


def decoding(num_seqs: int, steps: int) -> Scheduler:
    """A scheduler whose `num_seqs` requests (256-token prompts) are all past prefill."""
    s = Scheduler(
        SchedulerConfig(
            num_blocks=num_seqs * (PROMPT_LEN + steps + 16) // 16 + 1,
            block_size=16,
            max_num_seqs=num_seqs,
            max_num_batched_tokens=1 << 20,
            max_model_len=4096,
            max_num_waiting=num_seqs,
            eos_token_ids=[0],
        )
    )
    params = SamplingParams(ignore_eos=True)
    base = np.arange(PROMPT_LEN, dtype=np.int64)
    for i in range(num_seqs):
        s.add_request(NewRequest(i, 1 + (base * 7 + i) % 30000, params, arrival_time=0.0))
    plan = s.schedule(now=0.0)
    s.update(plan, np.ones(plan.num_samples, dtype=np.int64))
    return s


def bench(num_seqs: int, steps: int, repeats: int) -> float:
    """Best mean step time in seconds over `repeats` runs of `steps` steps."""
    best = float("inf")
    sampled = np.ones(num_seqs, dtype=np.int64)
    for _ in range(repeats):
        s = decoding(num_seqs, steps)
        start = time.perf_counter()
        for _ in range(steps):
            plan = s.schedule(now=1.0)
            s.update(plan, sampled)
        best = min(best, (time.perf_counter() - start) / steps)
        assert plan.num_samples == num_seqs
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="5 steps, 1 repeat")
    args = parser.parse_args()
    if args.smoke:  # the smallest sizes; flags given still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    for num_seqs in (64, 256, 1024):
        t = bench(num_seqs, args.steps, args.repeats)
        print(
            f"scheduler.py steady_decode num_seqs={num_seqs} "
            f"us_per_step={t * 1e6:.1f} us_per_seq={t * 1e6 / num_seqs:.3f}"
        )


if __name__ == "__main__":
    main()
