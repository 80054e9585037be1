"""Greedy generation with and without `--speculative ngram` (prompt-lookup decoding) on the
default model, on a workload whose output repeats its prompt (quoting a given text) and on one
whose output does not (free writing).

Both engines load the same model (SmolLM2-135M-Instruct Q4_1) in one process and get the same
chat prompts; runs alternate between them (best of `--repeats`), and their outputs are checked
against each other: in float32 they are token-for-token identical; in reduced precision
(bfloat16 activations) a multi-position verify step rounds differently from a one-token step,
so a near-tie can flip and the outputs can part (the line says how many matched). One line
per workload and batch size: output tokens/s of each, the ratio, the draft acceptance rate
(accepted / proposed draft tokens) and the output tokens per step and sequence of the
speculative engine.

Usage: python benches/speculative.py [--batches 1 8] [--max-tokens 128] [--repeats 2]
                                     [--num-speculative-tokens 4] [--device cpu]
                                     [--dtype auto] [--quantization auto] [--ngram-min 1]
                                     [--smoke]

``--smoke``: batch 1, 8 tokens, 1 repeat, eager engines (``compile="off"``) with a 256-token
step budget: that the bench still runs (the test suite runs it).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import torch

from ferrollm import SamplingParams
from ferrollm.llm import LLM

TEXT = (
    "The printing press, invented by Johannes Gutenberg around 1440, changed how knowledge "
    "travelled. Books that once took scribes months to copy could be produced in days, prices "
    "fell, literacy rose, and ideas spread across Europe faster than any ruler could control."
)
WORKLOADS = {
    "quote": [f"Repeat the following text exactly, word for word:\n\n{TEXT}"],
    "free": [
        "Write a short story about a robot who learns to paint.",
        "Explain why the sky is blue to a ten-year-old.",
        "Describe your ideal weekend in detail.",
        "Give advice to someone starting their first job.",
    ],
}
#: --smoke: both workloads at the smallest size.
SMOKE = {"batches": [1], "max_tokens": 8, "repeats": 1}
#: --smoke's engines: no inductor compile, a short start-up profiling pass, a small KV cache.
SMOKE_ENGINE = {"compile": "off", "max_num_batched_tokens": 256, "max_model_len": 512,
                "kv_cache_memory": "64MiB"}  # fmt: skip


def prompt_ids(llm: LLM, workload: str, batch: int) -> list[list[int]]:
    tokenizer = llm.get_tokenizer()
    texts = WORKLOADS[workload]
    return [
        list(tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": t}])))
        for t in (texts[i % len(texts)] for i in range(batch))
    ]


def timed(
    llm: LLM, prompts: list[list[int]], max_tokens: int
) -> tuple[float, list[list[int]], int]:
    """(seconds, output token ids, steps) of one greedy run."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    steps_before = llm.engine.scheduler.stats()["num_steps"]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    steps = llm.engine.scheduler.stats()["num_steps"] - steps_before
    return seconds, [list(o.outputs[0].token_ids) for o in outputs], steps


def compare(plain: LLM, spec: LLM, workload: str, batch: int, args: argparse.Namespace) -> str:
    prompts = prompt_ids(plain, workload, batch)
    best = {"plain": float("inf"), "ngram": float("inf")}
    stats = spec.engine.scheduler.stats
    before = stats()
    spec_steps = 0
    for _ in range(args.repeats):
        plain_s, want, _ = timed(plain, prompts, args.max_tokens)
        spec_s, got, spec_steps = timed(spec, prompts, args.max_tokens)
        same = sum(a == b for a, b in zip(got, want, strict=True))
        best["plain"] = min(best["plain"], plain_s)
        best["ngram"] = min(best["ngram"], spec_s)
    num_tokens = sum(map(len, want))
    after = stats()
    drafted = after["num_draft_tokens"] - before["num_draft_tokens"]
    accepted = after["num_accepted_draft_tokens"] - before["num_accepted_draft_tokens"]
    plain_rate, spec_rate = num_tokens / best["plain"], num_tokens / best["ngram"]
    rate = accepted / drafted if drafted else 0.0
    per_step = num_tokens / max(spec_steps * batch, 1)
    return (
        f"{workload:5s} batch {batch:3d}: plain {plain_rate:7.1f} tok/s | ngram {spec_rate:7.1f} "
        f"tok/s | {spec_rate / plain_rate:5.2f}x | accepted {rate:6.1%} of "
        f"{drafted // args.repeats} drafts | {per_step:4.2f} tok/step/seq ({num_tokens} tokens)"
        f" | {same}/{batch} outputs identical"
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    options = {
        "device": args.device,
        "dtype": args.dtype,
        "quantization": args.quantization,
        "max_num_seqs": max(args.batches),
        "seed": 0,
        **(SMOKE_ENGINE if args.smoke else {}),
    }
    plain = LLM(**options)
    spec = LLM(
        speculative="ngram",
        num_speculative_tokens=args.num_speculative_tokens,
        ngram_min=args.ngram_min,
        **options,
    )
    runner = plain.engine.runner
    print(
        f"SmolLM2-135M-Instruct Q4_1 ({runner.model.quantization or 'dense'}), "
        f"{runner.device.type}, {str(runner.dtype).removeprefix('torch.')}, "
        f"{torch.get_num_threads()} torch threads, greedy, up to {args.max_tokens} new tokens, "
        f"ngram {args.ngram_min}..3, {args.num_speculative_tokens} draft tokens, "
        f"best of {args.repeats}"
    )
    warm = prompt_ids(plain, "free", 1)
    timed(plain, warm, 4)
    timed(spec, warm, 4)
    for workload in WORKLOADS:
        for batch in args.batches:
            print(compare(plain, spec, workload, batch, args), flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--device", default=None, help="cpu, cuda or npu (default: detected)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default="auto")
    parser.add_argument("--ngram-min", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="batch 1, 8 tokens, 1 repeat")
    args = parser.parse_args(argv)
    if args.smoke:  # the smallest sizes; flags given still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    return args


if __name__ == "__main__":
    main()
