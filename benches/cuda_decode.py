"""Decode speed of a Llama-3-8B-shaped model on a GPU, against its memory-bandwidth roofline.

No checkpoint is needed: the script writes a Llama-3-8B ``config.json`` (bfloat16, untied head,
16 GB of weights) and a WordLevel tokenizer over its 128256 ids into a scratch directory, and
the engine fills the weights with random values on the device (``load_format="dummy"``,
docs/offline.md#dummy-weights). Decode at these sizes is memory-bound, so values do not matter.

For each engine (``--graphs``: "off" is ``compile="off"``, eager; "on" is ``compile="on"``,
which on CUDA means CUDA-graph decode steps; an engine that fails to build is one ``ERROR``
line and the run goes on), one line per measurement:

  bandwidth device=cuda copy=1.00 GiB: 3012.3 GB/s (read + written, median of 7)
  engine graphs=off: ready in 9.1 s on cuda, 5155 KV blocks
  decode batch=1 graphs=off: 123.4 tok/s, step 8.10 ms, floor 5.40 ms (weights 15.01 GB
      + kv 0.03 GB at 3012 GB/s), 67% of roofline
  prefill len=2048 graphs=off: 12345.6 tok/s (best of 3)
  engine graphs=off: 0 preemptions

- engine: its start-up time (the dummy fill of 16 GB included) and KV blocks; preemptions
  should be 0 (the KV cache is sized for the largest batch at full length, with a quarter
  to spare), else the decode lines include recomputed prefills.

- bandwidth: a device-to-device ``copy_`` of a large buffer in this process (bytes read plus
  bytes written over the time); the roofline's bandwidth.
- decode: ``--batches`` prompts of ``--prompt-len`` random token ids, greedy, ``ignore_eos``.
  The decode rate comes from the difference of two runs, ``max_tokens=T`` minus
  ``max_tokens=1`` (each the best of ``--repeats``), over ``batch * (T - 1)`` tokens: that
  takes the prefill out. Step = batch / rate. Prefix caching is off, so no run reuses another's
  prompt. The step budget is the accelerator default (8192 tokens), so at batch 256 the
  prompts prefill over 4 steps: about 3 of the T run's 127 decode steps ride along on prefill
  steps or run part-empty (~2%).
- floor: the bytes one decode step must read over the measured bandwidth. Weights: every
  parameter's bytes, except that an untied embedding table is only looked up (``batch`` rows,
  not the table); KV: ``batch`` sequences at their mean context over the decode
  (``prompt_len + T / 2``) times the bytes per token of the KV cache. Roofline = floor / step.
- prefill: one prompt of ``--prefill-len`` tokens, ``max_tokens=1``, best of 3 after a warm-up.

A summary table closes the run. Each measurement that raises prints ``ERROR <what>: <error>``
and the rest still runs (the summary lists what failed, and the exit status is then 1).
Engines are released (and the device's cache emptied) before the next is built, as two 16 GB
engines need not fit side by side.

Usage: python benches/cuda_decode.py [--device cuda] [--shape llama3-8b|tiny]
                                     [--graphs both|on|off] [--batches 1 8 64 256]
                                     [--prompt-len 128] [--max-tokens 128]
                                     [--prefill-len 2048] [--repeats 2] [--dtype bfloat16]
                                     [--smoke]

``--smoke``: ``--device cpu --shape tiny --graphs off``, batches 1 and 2, 8-token prompts, 32
new tokens (fewer and a loaded machine's noise can outweigh the decode time), a 32-token
prefill, best of 3: that the bench still runs (the test suite runs it; on a GPU,
``--smoke --device cuda`` checks the CUDA path in seconds).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ferrollm import SamplingParams
from ferrollm.llm import LLM
from ferrollm.platforms import get_platform

#: config.json of each ``--shape``: Meta-Llama-3-8B's, and a tiny one for CPU smoke runs.
LLAMA3_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "rope_theta": 500000.0,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
}
SHAPES: dict[str, dict[str, Any]] = {
    "llama3-8b": LLAMA3_8B,
    "tiny": {
        **LLAMA3_8B,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "max_position_embeddings": 2048,
    },
}
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
#: What failed this run (``attempt``): the summary counts it and the exit status is 1.
FAILURES: list[str] = []
#: --smoke: the smallest CPU run; flags given still win.
SMOKE = {
    "device": "cpu",
    "shape": "tiny",
    "graphs": "off",
    "batches": [1, 2],
    "prompt_len": 8,
    "max_tokens": 32,
    "prefill_len": 32,
    "repeats": 3,
    "copy_mib": 64,
}


def write_model_dir(directory: Path, config: dict[str, Any]) -> Path:
    """``config`` as config.json beside a WordLevel tokenizer naming every id (``t<id>``, ids
    0 and 1 BOS and EOS): prompts are token ids, the tokenizer only has to load and detokenize.
    Its decoder is ByteLevel, as Llama 3's is, so detokenizing costs what it costs there (the
    byte-table fast path)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    (directory / "config.json").write_text(json.dumps(config))
    vocab = {BOS: 0, EOS: 1, **{f"t{i}": i for i in range(2, config["vocab_size"])}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=EOS))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([BOS, EOS])
    tokenizer.save(str(directory / "tokenizer.json"))
    special = {"bos_token": BOS, "eos_token": EOS}
    (directory / "tokenizer_config.json").write_text(json.dumps(special))
    return directory


def copy_bandwidth(device: torch.device, num_bytes: int, repeats: int = 7) -> float:
    """Bytes per second of ``dst.copy_(src)`` on ``device`` (read + written), the median of
    ``repeats`` timings of 4 back-to-back copies each (so one sync is a small share)."""
    platform = get_platform(device.type)
    src = torch.ones(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    platform.synchronize()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(4):
            dst.copy_(src)
        platform.synchronize()
        seconds.append((time.perf_counter() - start) / 4)
    return 2 * num_bytes / statistics.median(seconds)


@dataclass(frozen=True)
class Footprint:
    """What one decode step must read: the weights once, and each sequence's KV."""

    #: Weight bytes a decode step reads (an untied embedding table only by rows: left out).
    weight_bytes: int
    #: KV-cache bytes per token of context (all layers, K and V).
    kv_bytes_per_token: int

    @classmethod
    def of(cls, llm: LLM) -> Footprint:
        model: Any = llm.engine.runner.model  # a LlamaForCausalLM (this bench's shapes)
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        embed = model.model.embed_tokens.weight
        if model.lm_head is not None and embed is not None:  # untied: looked up, not read
            weights -= embed.numel() * embed.element_size()
        return cls(weights, llm.engine.runner.kv_cache.spec.bytes_per_token)

    def step_bytes(self, batch: int, mean_context: float) -> tuple[int, int]:
        """(weight bytes, KV bytes) one decode step of ``batch`` sequences reads."""
        return self.weight_bytes, int(batch * mean_context * self.kv_bytes_per_token)


class Prompts:
    """Fresh random prompts (token ids past BOS/EOS), seeded: no two runs share a prompt."""

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)

    def batch(self, batch: int, length: int) -> list[list[int]]:
        return [
            [self.rng.randrange(2, self.vocab_size) for _ in range(length)] for _ in range(batch)
        ]


def timed_generate(llm: LLM, prompts: list[list[int]], max_tokens: int) -> float:
    """Seconds for ``llm.generate`` of ``prompts`` to make ``max_tokens`` tokens each."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    made = [len(o.outputs[0].token_ids) for o in outputs]
    if made != [max_tokens] * len(prompts):
        raise RuntimeError(f"asked for {max_tokens} tokens per prompt, got {sorted(set(made))}")
    return seconds


@dataclass(frozen=True)
class DecodeResult:
    graphs: str
    batch: int
    tok_s: float
    step_ms: float
    floor_ms: float

    @property
    def roofline(self) -> float:
        return self.floor_ms / self.step_ms


def measure_decode(
    llm: LLM, prompts: Prompts, args: argparse.Namespace, batch: int
) -> tuple[float, float]:
    """(decode tok/s, step seconds) at ``batch``: best T run minus best 1-token run."""
    timed_generate(llm, prompts.batch(batch, args.prompt_len), 4)  # warm-up at this batch
    full = min(
        timed_generate(llm, prompts.batch(batch, args.prompt_len), args.max_tokens)
        for _ in range(args.repeats)
    )
    first = min(
        timed_generate(llm, prompts.batch(batch, args.prompt_len), 1) for _ in range(args.repeats)
    )
    if full <= first:
        raise RuntimeError(f"{args.max_tokens} tokens took {full:.4f} s, 1 token {first:.4f} s")
    rate = batch * (args.max_tokens - 1) / (full - first)
    return rate, batch / rate


def measure_prefill(llm: LLM, prompts: Prompts, length: int) -> float:
    """Prefill tok/s of one ``length``-token prompt (best of 3 after a warm-up)."""
    timed_generate(llm, prompts.batch(1, length), 1)
    best = min(timed_generate(llm, prompts.batch(1, length), 1) for _ in range(3))
    return length / best


def attempt(what: str, run: Callable[[], Any]) -> Any:
    """``run()``, or None after printing ``ERROR <what>: <error>`` (the run goes on)."""
    try:
        return run()
    except Exception as e:  # any failure is reported and skipped
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"ERROR {what}: {type(e).__name__}: {message}", flush=True)
        FAILURES.append(what)
        return None


def engine_options(args: argparse.Namespace, config: dict[str, Any]) -> dict[str, Any]:
    """Engine options sized for this run: every batch at full length fits the KV cache (with a
    quarter to spare), and so does the prefill prompt."""
    longest = max(args.prompt_len + args.max_tokens, args.prefill_len + 1)
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    dtype_bytes = 4 if args.dtype in ("float32", "fp32", "float") else 2
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim
    per_token *= dtype_bytes
    block = 16
    blocks = max(args.batches) * math.ceil((args.prompt_len + args.max_tokens) / block)
    blocks = max(blocks, math.ceil(longest / block)) + 2
    return {
        "load_format": "dummy",
        "device": args.device,
        "dtype": args.dtype,
        "max_num_seqs": max(args.batches),
        "max_model_len": longest,
        "kv_cache_memory": int(blocks * block * per_token * 1.25) + (64 << 20),
        "block_size": block,
        "enable_prefix_caching": False,
        "seed": 0,
    }


def run_engine(
    directory: Path, graphs: str, args: argparse.Namespace, config: dict[str, Any]
) -> tuple[list[DecodeResult], float | None]:
    """Build the engine with ``compile=graphs``, measure it, release it; an engine that fails
    to build yields nothing (its ERROR line is printed)."""
    start = time.perf_counter()
    llm: LLM | None = attempt(
        f"engine graphs={graphs}",
        lambda: LLM(directory, compile=graphs, **engine_options(args, config)),
    )
    if llm is None:
        return [], None
    runner = llm.engine.runner
    print(
        f"engine graphs={graphs}: ready in {time.perf_counter() - start:.1f} s on "
        f"{runner.device}, {runner.kv_cache.num_blocks} KV blocks",
        flush=True,
    )
    try:
        measured = measure_engine(llm, graphs, args, config)
        stats = llm.engine.scheduler.stats()
        print(f"engine graphs={graphs}: {stats['num_preemptions']} preemptions", flush=True)
        return measured
    finally:
        llm.shutdown()
        del llm
        release(args.device)


def measure_engine(
    llm: LLM, graphs: str, args: argparse.Namespace, config: dict[str, Any]
) -> tuple[list[DecodeResult], float | None]:
    """Every batch's decode line, then the prefill line, of one engine."""
    footprint = attempt(f"footprint graphs={graphs}", lambda: Footprint.of(llm))
    prompts = Prompts(config["vocab_size"])  # each engine gets the same prompts
    mean_context = args.prompt_len + args.max_tokens / 2
    results = []
    for batch in args.batches:
        measured = attempt(
            f"decode batch={batch} graphs={graphs}",
            functools.partial(measure_decode, llm, prompts, args, batch),
        )
        if measured is None:
            continue
        rate, step = measured
        weights, kv = footprint.step_bytes(batch, mean_context) if footprint else (0, 0)
        floor = (weights + kv) / args.bandwidth if footprint else float("nan")
        result = DecodeResult(graphs, batch, rate, step * 1e3, floor * 1e3)
        results.append(result)
        print(
            f"decode batch={batch} graphs={graphs}: {rate:.1f} tok/s, step "
            f"{result.step_ms:.2f} ms, floor {result.floor_ms:.2f} ms (weights "
            f"{weights / 1e9:.2f} GB + kv {kv / 1e9:.2f} GB at {args.bandwidth / 1e9:.0f} "
            f"GB/s), {result.roofline:.0%} of roofline",
            flush=True,
        )
    prefill = attempt(
        f"prefill graphs={graphs}",
        functools.partial(measure_prefill, llm, prompts, args.prefill_len),
    )
    if prefill is not None:
        print(
            f"prefill len={args.prefill_len} graphs={graphs}: {prefill:.1f} tok/s (best of 3)",
            flush=True,
        )
    return results, prefill


def release(device: str) -> None:
    """Free what a released engine held, before the next is built."""
    torch._dynamo.reset()  # compiled graphs hold the model they were traced from
    gc.collect()
    if device == "cuda":
        # A bench, not the package: the platform layer has no cache-emptying helper.
        torch.cuda.empty_cache()  # noqa: TID251


def print_summary(results: list[DecodeResult], prefills: dict[str, float | None]) -> None:
    print("summary", flush=True)
    print(f"  {'graphs':6} {'batch':>5} {'tok/s':>10} {'step ms':>8} {'floor ms':>8} roofline")
    for r in results:
        print(
            f"  {r.graphs:6} {r.batch:5d} {r.tok_s:10.1f} {r.step_ms:8.2f} {r.floor_ms:8.2f} "
            f"{r.roofline:8.0%}"
        )
    for graphs, rate in prefills.items():
        shown = "ERROR" if rate is None else f"{rate:.1f} tok/s"
        print(f"  prefill graphs={graphs}: {shown}", flush=True)
    print(f"  failed: {', '.join(FAILURES) if FAILURES else 'none'}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    config = SHAPES[args.shape]
    device = torch.device(args.device)
    bandwidth = attempt("bandwidth", lambda: copy_bandwidth(device, args.copy_mib << 20))
    if bandwidth is not None:
        print(
            f"bandwidth device={device.type} copy={args.copy_mib / 1024:.2f} GiB: "
            f"{bandwidth / 1e9:.1f} GB/s (read + written, median of 7)",
            flush=True,
        )
    args.bandwidth = bandwidth or float("nan")
    print(
        f"shape {args.shape} ({config['num_hidden_layers']} layers, hidden "
        f"{config['hidden_size']}, vocab {config['vocab_size']}), {args.dtype}, dummy weights, "
        f"prompts of {args.prompt_len} random ids, {args.max_tokens} new tokens, greedy, "
        "ignore_eos",
        flush=True,
    )
    modes = ["off", "on"] if args.graphs == "both" else [args.graphs]
    results: list[DecodeResult] = []
    prefills: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory(prefix="ferrollm-cuda-decode-") as scratch:
        directory = write_model_dir(Path(scratch), config)
        for graphs in modes:
            decoded, prefills[graphs] = run_engine(directory, graphs, args, config)
            results += decoded
    print_summary(results, prefills)
    return 1 if FAILURES else 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--device", default="cuda", help="cuda (default), cpu or npu")
    parser.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--graphs",
        default="both",
        choices=["both", "on", "off"],
        help="engines to measure: compile off (eager), on (CUDA graphs on CUDA), or both",
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prefill-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=2, help="runs per timing (best kept)")
    parser.add_argument("--copy-mib", type=int, default=1024, help="bandwidth buffer size")
    parser.add_argument("--smoke", action="store_true", help="tiny shape on CPU, seconds")
    args = parser.parse_args(argv)
    if args.smoke:  # the smallest sizes; flags given still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    if args.max_tokens < 2:
        parser.error("--max-tokens must be at least 2 (decode is T runs minus 1-token runs)")
    return args


if __name__ == "__main__":
    sys.exit(main())
