"""Offline generation throughput: ferrollm's `LLM` against transformers, on the default model
or the GGUF file ``--model`` names.

Both sides get the same token ids (ferrollm's tokenizer), the same weights (by default the
SmolLM2-135M Q4_1 GGUF, each loading it its own way: `--quantization` says ferrollm's), the
same dtype and
the same torch threads, in one process;
each batch generates `--max-tokens` tokens per prompt with greedy decoding and no early stop
(`ignore_eos` / `min_new_tokens`). transformers runs `generate` on the left-padded batch.
One line per batch size: output tokens/s (best of `--repeats`) for both, and the ratio.

``--compile both`` also builds a second ferrollm engine with compiled decode steps
(``--compile on``; the first is eager) and prints both side by side with their ratio.

Usage: python benches/throughput.py [--model FILE.gguf] [--batches 1 8 32] [--max-tokens 128]
                                    [--repeats 1] [--device cpu] [--dtype auto]
                                    [--quantization auto] [--compile auto|on|off|both]
                                    [--no-transformers] [--smoke]

``--smoke``: batch 1, 4 tokens, ferrollm only (transformers' GGUF load alone takes longer than
the whole smoke run), eager (``--compile off``: inductor's first compile takes a minute), a
256-token step budget (the start-up profiling pass runs one such step): that the bench still
runs (the test suite runs it).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ferrollm import SamplingParams
from ferrollm.default_model import default_model_path
from ferrollm.llm import LLM

PROMPTS = [
    "The history of the printing press begins",
    "Write a short poem about the sea.",
    "Explain how a refrigerator works.",
    "List three uses for a paperclip:",
    "Once upon a time, in a small village,",
    "The main differences between Python and Rust are",
    "What is the capital of France?",
    "A good breakfast consists of",
]
#: --smoke: the smallest run, ferrollm only.
SMOKE = {"batches": [1], "max_tokens": 4, "compile": "off", "no_transformers": True}
#: --smoke's engine: a short start-up profiling pass, a small KV cache.
SMOKE_ENGINE = {"max_num_batched_tokens": 256, "max_model_len": 512, "kv_cache_memory": "64MiB"}


def prompt_ids(llm: LLM, batch: int) -> list[list[int]]:
    """``batch`` distinct prompts (numbered, so no two share a whole prompt), as token ids."""
    tokenizer = llm.get_tokenizer()
    texts = [f"{i}. {PROMPTS[i % len(PROMPTS)]}" for i in range(batch)]
    return [list(tokenizer.encode(text)) for text in texts]


def best_rate(run: Callable[[], int], repeats: int) -> float:
    """Best output tokens/s over ``repeats`` calls of ``run`` (which returns tokens made)."""
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        num_tokens = run()
        best = max(best, num_tokens / (time.perf_counter() - start))
    return best


def ferrollm_rate(llm: LLM, prompts: list[list[int]], max_tokens: int, repeats: int) -> float:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0)

    def run() -> int:
        outputs = llm.generate(prompts, params)
        return sum(len(o.outputs[0].token_ids) for o in outputs)

    return best_rate(run, repeats)


def load_transformers(path: Path, dtype: torch.dtype, device: torch.device) -> Any:
    """transformers' model for the same GGUF file (it dequantizes through the gguf package)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # keep the bench's output to its table
    model: Any = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    return model.to(device).eval()


def transformers_rate(
    model: Any, prompts: list[list[int]], max_tokens: int, repeats: int, pad_id: int
) -> float:
    device = next(model.parameters()).device
    width = max(map(len, prompts))
    # Left padding, as decoder-only generation needs.
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)

    def run() -> int:
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                pad_token_id=pad_id,
            )
        return int((out.shape[1] - width) * out.shape[0])

    return best_rate(run, repeats)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    options = {
        "device": args.device,
        "dtype": args.dtype,
        "quantization": args.quantization,
        "max_num_seqs": max(args.batches),
        **(SMOKE_ENGINE if args.smoke else {}),
    }
    both = args.compile == "both"
    path = Path(args.model) if args.model else default_model_path()
    llm = LLM(path, **options, compile="off" if both else args.compile)
    compiled = LLM(path, **options, compile="on") if both else None
    runner = llm.engine.runner
    hf = None if args.no_transformers else load_transformers(path, runner.dtype, runner.device)
    pad_id = llm.engine.model_config.pad_token_id or 0
    weights = runner.model.quantization or "dense"
    print(
        f"{path.name} (ferrollm weights: {weights}), {runner.device.type}, "
        f"{str(runner.dtype).removeprefix('torch.')}, {torch.get_num_threads()} torch threads, "
        f"{args.max_tokens} new tokens per prompt, greedy, ignore_eos"
    )
    warm = prompt_ids(llm, 1)
    ferrollm_rate(llm, warm, 4, 1)
    if compiled is not None:
        ferrollm_rate(compiled, warm, 4, 1)
    if hf is not None:
        transformers_rate(hf, warm, 4, 1, pad_id)
    for batch in args.batches:
        prompts = prompt_ids(llm, batch)
        ours = ferrollm_rate(llm, prompts, args.max_tokens, args.repeats)
        line = f"batch {batch:3d}: ferrollm {ours:8.1f} tok/s"
        if compiled is not None:
            fast = ferrollm_rate(compiled, prompts, args.max_tokens, args.repeats)
            line = (
                f"batch {batch:3d}: ferrollm eager {ours:8.1f} tok/s | compiled {fast:8.1f} tok/s"
                f" | {fast / ours:5.2f}x"
            )
        if hf is not None:
            theirs = transformers_rate(hf, prompts, args.max_tokens, args.repeats, pad_id)
            line += f" | transformers {theirs:8.1f} tok/s | {ours / theirs:5.2f}x"
        print(line, flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--model", default=None, help="a GGUF file (default: the default model)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--device", default=None, help="cpu, cuda or npu (default: detected)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default="auto")
    parser.add_argument(
        "--compile",
        default="auto",
        choices=["auto", "on", "off", "both"],
        help="ferrollm's compiled decode steps; both: eager and compiled side by side",
    )
    parser.add_argument("--no-transformers", action="store_true", help="ferrollm only")
    parser.add_argument("--smoke", action="store_true", help="batch 1, 4 tokens, eager, ours")
    args = parser.parse_args(argv)
    if args.smoke:  # the smallest sizes; flags given still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    return args


if __name__ == "__main__":
    main()
