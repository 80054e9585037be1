"""Beam search on the default model: ferrollm against transformers' ``generate(num_beams=...)``.

Beam widths 4 and 8, 128 new tokens (``ignore_eos``, so every hypothesis runs the full length),
one prompt, the same float32 weights (the GGUF dequantized by both sides) and the same torch
threads. One line per width: generated tokens per second for both (hypotheses' tokens summed
over the width, i.e. beam-steps x width / seconds), their ratio, and the peak KV blocks the
group held. A last line compares the KV blocks of a width-8 group with 8 independent sequences
of the same length (the same prompt sampled as 8 separate requests without prefix caching):
sharing must show.

ferrollm also runs in its default (fast) mode, quantized bf16 where the CPU has bf16 units;
that line has no transformers counterpart on the same weights and says so.

Usage: python benches/beam.py [--tokens N] [--widths 4 8] [--skip-hf] [--smoke]

``--smoke``: width 2, 8 tokens, ferrollm lines only (transformers' GGUF load alone takes
longer than the whole smoke run), eager engines (``compile="off"``) with a 256-token step
budget: that the bench still runs (the test suite runs it).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
import transformers

from ferrollm import LLM, SamplingParams
from ferrollm.default_model import default_model_path
from ferrollm.engine import EngineRequest, RequestOutput

PROMPT = "The history of the city of Paris begins"
#: --smoke: the smallest beam group, no transformers.
SMOKE = {"tokens": 8, "widths": [2], "skip_hf": True}
#: --smoke's engines: no inductor compile, a short start-up profiling pass.
SMOKE_ENGINE = {"compile": "off", "max_num_batched_tokens": 256}


def run_engine(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[float, int]:
    """Seconds to finish every prompt, and the most KV blocks in use after any step."""
    engine = llm.engine
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(EngineRequest.of(f"bench-{time.monotonic_ns()}-{i}", prompt, params))
    peak = 0
    done: list[RequestOutput] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if isinstance(out, RequestOutput) and out.finished:
                done.append(out)
        peak = max(peak, engine.scheduler.stats()["num_used_blocks"])
    return time.perf_counter() - start, peak


def run_hf(hf: Any, prompt: list[int], width: int, tokens: int) -> float:
    ids = torch.tensor([prompt])
    start = time.perf_counter()
    hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        num_beams=width,
        num_return_sequences=1,
        max_new_tokens=tokens,
        min_new_tokens=tokens,
        pad_token_id=0,
    )
    return time.perf_counter() - start


def beam_params(width: int, tokens: int) -> SamplingParams:
    return SamplingParams(
        use_beam_search=True, best_of=width, n=1, max_tokens=tokens, ignore_eos=True
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--widths", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--skip-hf", action="store_true", help="ferrollm lines only")
    parser.add_argument("--smoke", action="store_true", help="width 2, 8 tokens, no transformers")
    args = parser.parse_args()
    if args.smoke:  # the smallest sizes; flags given still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    path = default_model_path()
    options = {"kv_cache_memory": "256MiB", "max_num_seqs": 16, "max_model_len": 512}
    if args.smoke:
        options |= SMOKE_ENGINE
    parity = LLM(dtype="float32", quantization="none", **options)
    fast = LLM(**options)
    prompt = parity.get_tokenizer().encode(PROMPT)
    hf = None
    if not args.skip_hf:
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        ).eval()
    print(
        f"# beam search, {len(prompt)}-token prompt, {args.tokens} new tokens, "
        f"{torch.get_num_threads()} torch threads; tok/s = width x {args.tokens} / seconds"
    )
    for width in args.widths:
        params = beam_params(width, args.tokens)
        run_engine(parity, [prompt], beam_params(width, 4))  # warm-up
        ours, peak = run_engine(parity, [prompt], params)
        fast_s, _ = run_engine(fast, [prompt], params)
        total = width * args.tokens
        line = (
            f"beam width={width}: ferrollm f32 {total / ours:.1f} tok/s "
            f"(fast mode {total / fast_s:.1f})"
        )
        if hf is not None:
            run_hf(hf, prompt, width, 4)  # warm-up
            theirs = run_hf(hf, prompt, width, args.tokens)
            line += f", transformers f32 {total / theirs:.1f} tok/s, ratio {theirs / ours:.2f}x"
        print(f"{line}, peak KV blocks {peak}")
    width = max(args.widths)
    _, shared = run_engine(parity, [prompt], beam_params(width, args.tokens))
    apart = LLM(dtype="float32", quantization="none", enable_prefix_caching=False, **options)
    independent = SamplingParams(max_tokens=args.tokens, ignore_eos=True, seed=0)
    _, separate = run_engine(apart, [prompt] * width, independent)
    print(
        f"KV blocks: beam group of {width} {shared}, {width} independent sequences "
        f"{separate} ({separate / shared:.2f}x)"
    )


if __name__ == "__main__":
    main()
