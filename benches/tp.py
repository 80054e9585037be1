"""Tensor parallelism offline: output tokens/s at TP=1 and TP=2, and the collectives' share.

Each tensor-parallel size loads the model (the default SmolLM2-135M GGUF unless ``--model``),
then each batch generates ``--max-tokens`` tokens per prompt, greedy, no early stop; one line
per (size, batch) with the best output tokens/s of ``--repeats``, then one line per batch with
the TP=N/TP=1 ratio. Last, a torch profile of ``--profile-steps`` engine steps at the largest
batch on rank 0 of each size > 1: the share of the steps' time spent in collectives
(``c10d`` broadcast of the plan, all-reduce / all-gather inside the model). On CPU the ranks
split the cores between them (``share_cpu_threads``), so expect little gain here.

The default model has 9 attention heads, which do not split in two: ``--random-llama DIR``
builds (once, into DIR) a random-weight Llama of the same size whose heads do (8 query heads,
4 KV heads, hidden 576, 30 layers, 49152-token vocabulary; the tests' tiny tokenizer).

``--smoke``: the tests' tiny random Llama (2 layers, hidden 64, 4 query and 2 KV heads; built
into a scratch directory unless ``--model`` or ``--random-llama`` is given) at TP=1 and TP=2,
batch 1, 4 tokens, a 2-step profile: that the bench still runs (the test suite runs it).

Usage: python benches/tp.py [--model PATH | --random-llama DIR] [--sizes 1 2]
                            [--batches 1 32] [--max-tokens 32] [--repeats 1]
                            [--dtype float32] [--quantization none]
                            [--profile-steps 8] [--smoke]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from ferrollm import SamplingParams
from ferrollm.engine import EngineRequest
from ferrollm.llm import LLM

PROMPT = "The history of the printing press begins"
#: Profiler event names of the group's collectives (c10d's ops and gloo's own).
COLLECTIVES = ("broadcast", "all_reduce", "allreduce", "all_gather", "allgather", "gather")
#: --smoke (on the tests' tiny Llama): both sizes, the smallest batch and run.
SMOKE = {"batches": [1], "max_tokens": 4, "profile_steps": 2}


def prompts(llm: LLM, batch: int) -> list[list[int]]:
    """``batch`` distinct numbered prompts, as token ids."""
    encode = llm.get_tokenizer().encode
    return [list(encode(f"{i}. {PROMPT}")) for i in range(batch)]


def rate(llm: LLM, batch: int, max_tokens: int, repeats: int) -> float:
    """Best output tokens/s over ``repeats`` generate calls of ``batch`` prompts."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0)
    ids = prompts(llm, batch)
    llm.generate(ids[:1], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = llm.generate(ids, params)
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        best = max(best, tokens / (time.perf_counter() - start))
    return best


def collective_share(llm: LLM, batch: int, num_steps: int) -> tuple[float, float]:
    """(collectives' share of the profiled steps' CPU time, step ms) over ``num_steps``
    decode-heavy steps of ``batch`` requests, on this rank."""
    engine = llm.engine
    params = SamplingParams(max_tokens=num_steps + 8, ignore_eos=True, temperature=0)
    for i, ids in enumerate(prompts(llm, batch)):
        engine.add_request(EngineRequest.of(f"profile-{i}", ids, params))
    for _ in range(4):  # past the prefills
        engine.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(num_steps):
            engine.step()
        elapsed = time.perf_counter() - start
    engine.abort_all()
    collective_us = sum(
        event.cpu_time_total
        for event in prof.key_averages()
        if event.key.startswith("c10d::") and any(c in event.key for c in COLLECTIVES)
    )
    return collective_us / 1e6 / elapsed, elapsed / num_steps * 1e3


#: SmolLM2-135M's shape with heads that split in two (it has 9 query and 3 KV heads).
SPLITTABLE_135M = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}


def random_llama(directory: Path, sizes: dict[str, Any] | None = SPLITTABLE_135M) -> Path:
    """A random-weight Llama of ``sizes`` (None: the tests' tiny one) in ``directory`` (built
    once)."""
    if not (directory / "config.json").exists():
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from tiny_models import build_tiny_model

        build_tiny_model("llama3", directory, sizes=sizes)
    return directory


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ferrollm-bench-tp-") as scratch:
        if args.random_llama is not None:
            args.model = str(random_llama(args.random_llama))
        elif args.smoke and args.model is None:
            args.model = str(random_llama(Path(scratch), sizes=None))
        run(args)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--random-llama", type=Path, default=None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--profile-steps", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="tiny Llama, batch 1, 4 tokens")
    args = parser.parse_args(argv)
    if args.smoke:  # the smallest sizes; flags given still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    return args


def run(args: argparse.Namespace) -> None:
    """Each size's rates, then the ratios and the collectives' shares."""
    threads = torch.get_num_threads()
    rates: dict[tuple[int, int], float] = {}
    shares: dict[int, tuple[float, float]] = {}
    for size in args.sizes:
        torch.set_num_threads(threads)  # a TP run lowers this process's share of the cores
        llm = LLM(
            args.model,
            tensor_parallel_size=size,
            dtype=args.dtype,
            quantization=args.quantization,
            max_model_len=512,
            kv_cache_memory="512MiB",
            max_num_batched_tokens=512,
        )
        try:
            for batch in args.batches:
                rates[size, batch] = rate(llm, batch, args.max_tokens, args.repeats)
                print(
                    f"tp={size} batch={batch:>3}: {rates[size, batch]:8.1f} output tok/s "
                    f"({args.max_tokens} tokens each, {args.dtype}, {args.quantization})",
                    flush=True,
                )
            if size > 1 and args.profile_steps:
                shares[size] = collective_share(llm, max(args.batches), args.profile_steps)
        finally:
            llm.shutdown()
    base = min(args.sizes)
    for size in args.sizes:
        if size == base:
            continue
        for batch in args.batches:
            ratio = rates[size, batch] / rates[base, batch]
            print(f"batch={batch:>3}: tp={size} / tp={base} = {ratio:.2f}x", flush=True)
    for size, (share, step_ms) in shares.items():
        print(
            f"tp={size} batch={max(args.batches)}: collectives {share * 100:.1f}% of a "
            f"{step_ms:.1f} ms step on rank 0 (torch profile of {args.profile_steps} steps)",
            flush=True,
        )


if __name__ == "__main__":
    main()
