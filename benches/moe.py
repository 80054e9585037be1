"""Mixture of experts offline: output tokens/s and the share of the time in expert dispatch.

The model is a random-weight Qwen3-MoE with the layer shape of Qwen3-30B-A3B (hidden 2048, 32
query and 4 KV heads of 128, 128 experts of 768 features, top-8 renormalised), cut to
``--layers`` layers and a 32k vocabulary so that it fits a small machine's memory (2 layers:
1.2B weights, 2.4 GB in bfloat16); it is built once into ``--dir``. Each batch generates
``--max-tokens`` tokens per prompt, greedy, no early stop; one line per batch: output tokens/s,
and the share of the generate call's wall time spent in ``fused_moe.dispatch`` (the grouped
expert matmuls) and in the whole sparse blocks (router, dispatch, shared expert).

``--smoke``: the tests' tiny Qwen3-MoE (8 experts, top-2), batch 1, 4 tokens: that the bench
still runs (the test suite runs it).

Usage: python benches/moe.py [--dir DIR] [--layers 2] [--batches 1 32] [--max-tokens 32]
                             [--dtype bfloat16] [--quantization none] [--smoke]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ferrollm import SamplingParams
from ferrollm.llm import LLM
from ferrollm.models import moe

#: Qwen3-30B-A3B's layer shape (its config.json), with fewer layers and a smaller vocabulary.
QWEN3_30B_A3B_LAYER = {
    "vocab_size": 32768,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "max_position_embeddings": 4096,
}
PROMPT = "The history of the printing press begins"


def random_moe(directory: Path, sizes: dict[str, Any] | None) -> Path:
    """A random-weight Qwen3-MoE of ``sizes`` (None: the tests' tiny one) in ``directory``,
    built once."""
    if not (directory / "config.json").exists():
        import torch

        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from tiny_models import build_tiny_model

        build_tiny_model("qwen3-moe", directory, sizes=sizes, dtype=torch.bfloat16)
    return directory


class Clock:
    """Wall time spent inside the wrapped functions."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


@contextmanager
def clocks() -> Iterator[tuple[Clock, Clock]]:
    """``(dispatch, sparse blocks)`` clocks, installed on the MoE module while open."""
    dispatch, blocks = Clock(), Clock()
    original_dispatch, original_forward = moe.dispatch, moe.SparseMoeBlock.forward
    moe.dispatch = dispatch.wrap(original_dispatch)  # type: ignore[assignment]
    moe.SparseMoeBlock.forward = blocks.wrap(original_forward)  # type: ignore[method-assign]
    try:
        yield dispatch, blocks
    finally:
        moe.dispatch = original_dispatch  # type: ignore[assignment]
        moe.SparseMoeBlock.forward = original_forward  # type: ignore[method-assign]


def run(args: argparse.Namespace) -> None:
    llm = LLM(
        args.model,
        dtype=args.dtype,
        quantization=args.quantization,
        max_num_seqs=max(args.batches),
        max_model_len=512,
    )
    c = llm.engine.model_config
    assert c.moe is not None
    print(
        f"random Qwen3-MoE: {c.num_hidden_layers} layers, hidden {c.hidden_size}, "
        f"{c.moe.num_experts} experts of {c.moe.expert_intermediate_size} features, top "
        f"{c.moe.num_experts_per_tok}; {args.dtype}, weights {args.quantization}, "
        f"{args.max_tokens} new tokens per prompt"
    )
    encode = llm.get_tokenizer().encode
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, temperature=0)
    llm.generate([list(encode(PROMPT))], SamplingParams(max_tokens=2, ignore_eos=True))
    for batch in args.batches:
        prompts = [list(encode(f"{i}. {PROMPT}")) for i in range(batch)]
        with clocks() as (dispatch, blocks):
            start = time.perf_counter()
            outputs = llm.generate(prompts, params)
            wall = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        print(
            f"batch {batch:3d}: {tokens / wall:8.1f} tok/s, expert dispatch "
            f"{100 * dispatch.seconds / wall:4.1f}% of the time, sparse blocks "
            f"{100 * blocks.seconds / wall:4.1f}%",
            flush=True,
        )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ferrollm-bench-moe-") as scratch:
        if args.smoke:
            args.batches, args.max_tokens = [1], 4
            args.model = str(random_moe(Path(scratch), None))
        else:
            sizes = {**QWEN3_30B_A3B_LAYER, "num_hidden_layers": args.layers}
            args.model = str(random_moe(args.dir, sizes))
        run(args)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_dir = Path(tempfile.gettempdir()) / "ferrollm-qwen3-moe-a3b-shape"
    parser.add_argument("--dir", type=Path, default=default_dir, help="where the model is built")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--smoke", action="store_true", help="tiny model, batch 1, 4 tokens")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
