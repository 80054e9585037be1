"""Structured output's cost: the default model generating with and without a ``json_schema``
grammar, at 1 and 32 concurrent requests through the engine (offline, the server's engine
loop without HTTP), side by side in one run.

Each request asks for a person as JSON at temperature 1 (seeded), ``max_tokens`` 64; the
unconstrained run uses ``ignore_eos`` so both sides generate comparable token counts. One line
per concurrency: output tokens per second for both, and the overhead of the grammar (masks
computed in Rust every step, in parallel across rows). The schema has 10 properties.

Usage: python benches/structured.py [--concurrency 1 32] [--tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import time

from ferrollm import LLM, SamplingParams
from ferrollm.engine import EngineRequest, RequestOutput

SCHEMA = {
    "type": "object",
    "properties": {
        **{f"field_{i}": {"type": "string", "maxLength": 12} for i in range(6)},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "score": {"type": "number"},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["field_0", "age", "active"],
}


def run(llm: LLM, prompt: list[int], concurrency: int, tokens: int, constrained: bool) -> float:
    """Output tokens per second for ``concurrency`` requests run together."""
    engine = llm.engine
    grammar = None
    if constrained:
        grammar = engine.grammar_compiler.compile("json_schema", json.dumps(SCHEMA), "bench")
    start = time.perf_counter()
    for i in range(concurrency):
        params = SamplingParams(
            temperature=1.0, seed=i + 1, max_tokens=tokens, ignore_eos=not constrained
        )
        request = EngineRequest.of(f"b{time.monotonic_ns()}-{i}", prompt, params)
        engine.add_request(
            EngineRequest(request.request_id, request.prompt_token_ids, params, grammar=grammar)
        )
    generated = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if isinstance(out, RequestOutput) and out.finished:
                generated += sum(len(c.token_ids) for c in out.outputs)
    return generated / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    llm = LLM(kv_cache_memory="256MiB", max_num_seqs=64, max_model_len=512)
    tokenizer = llm.get_tokenizer()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Describe a person as JSON."}], None, True
    )
    prompt = tokenizer.encode(text, add_special_tokens=False)
    run(llm, prompt, 2, 8, constrained=True)  # warm-up: the compiler, the kernels
    print(f"# default model (fast mode), {args.tokens} tokens per request, 10-property schema")
    for concurrency in args.concurrency:
        # Alternating runs, best of each side: the order of the runs must not decide.
        free = grammar = 0.0
        for _ in range(args.repeats):
            free = max(free, run(llm, prompt, concurrency, args.tokens, constrained=False))
            grammar = max(grammar, run(llm, prompt, concurrency, args.tokens, constrained=True))
        print(
            f"concurrency={concurrency}: unconstrained {free:.1f} tok/s, json_schema "
            f"{grammar:.1f} tok/s, overhead {100 * (1 - grammar / free):.1f}%"
        )


if __name__ == "__main__":
    main()
