"""LoRA serving throughput: output tokens/s of one batch of concurrent requests spread over
0, 1, 4 and 16 distinct adapters, each as a ratio to the base model served without adapters.

The model is the default one (SmolLM2-135M-Instruct, its Q4_1 GGUF) unless ``--model`` names
another; the adapters are random PEFT adapters of rank ``--rank`` on every projection (q, k,
v, o, gate, up, down) of every layer, written in PEFT's format into a scratch directory (the
weights are random: speed does not depend on them). Two engines in one process, built alike
(``--dtype``, ``--compile``): the base without ``enable_lora``, and one with ``enable_lora``,
``max_loras`` = the most adapters a batch mixes, ``max_lora_rank`` = ``--max-lora-rank`` (the
server's default, 64, unless given: the slots' capacity, not what they compute). Each case
generates ``--max-tokens`` greedy tokens (no early stop) for ``--concurrency`` prompts at
once, request ``i`` on adapter ``i mod k`` (k = 0: the base model through the LoRA engine).
One line per case, best of ``--repeats``:

  lora adapters=4 concurrency=32 rank=16: 123.4 tok/s, 0.81x the base (150.2 tok/s)

Usage: python benches/lora.py [--model FILE] [--adapters 0 1 4 16] [--concurrency 32]
                              [--rank 16] [--max-lora-rank 64] [--max-tokens 64] [--repeats 1]
                              [--dtype auto] [--compile auto] [--smoke]
  --smoke   adapters 0 and 2, concurrency 4, rank 4, 4 tokens, compile off: that the bench
            still runs (the test suite runs it)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ferrollm import LLM, LoRARequest, SamplingParams
from ferrollm.default_model import default_model_path
from ferrollm.lora.options import DEFAULT_MAX_LORA_RANK

PROMPT = "The history of the printing press begins"
#: PEFT module names -> (input size, output size) from the model's config.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def projection_shapes(config: Any) -> dict[str, tuple[str, int, int]]:
    """PEFT module -> (its block, in_features, out_features) for a Llama-shaped ``config``."""
    hidden, heads = config.hidden_size, config.num_attention_heads
    q, kv = heads * config.head_dim, config.num_key_value_heads * config.head_dim
    inter = config.intermediate_size
    return {
        "q_proj": ("self_attn", hidden, q),
        "k_proj": ("self_attn", hidden, kv),
        "v_proj": ("self_attn", hidden, kv),
        "o_proj": ("self_attn", q, hidden),
        "gate_proj": ("mlp", hidden, inter),
        "up_proj": ("mlp", hidden, inter),
        "down_proj": ("mlp", inter, hidden),
    }


def random_adapter(directory: Path, config: Any, rank: int, seed: int) -> Path:
    """A PEFT LoRA adapter of ``rank`` on every projection of every layer, random weights."""
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for module, (block, n_in, n_out) in projection_shapes(config).items():
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = 0.01 * torch.randn(rank, n_in, generator=generator)
            tensors[f"{prefix}.lora_B.weight"] = 0.01 * torch.randn(
                n_out, rank, generator=generator
            )
    save_file(tensors, directory / "adapter_model.safetensors")
    peft_config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank}
    peft_config |= {"target_modules": list(PROJECTIONS), "bias": "none"}
    (directory / "adapter_config.json").write_text(json.dumps(peft_config))
    return directory


def rate(llm: LLM, prompts: list[list[int]], loras: list[LoRARequest | None], args: Any) -> float:
    """Best output tokens/s over ``args.repeats`` runs of the batch."""
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    best = 0.0
    for _ in range(args.repeats):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, loras)
        made = sum(len(o.outputs[0].token_ids) for o in outputs)
        best = max(best, made / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--adapters", type=int, nargs="+", default=[0, 1, 4, 16])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--max-lora-rank", type=int, default=DEFAULT_MAX_LORA_RANK)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--compile", default="auto")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.adapters, args.concurrency, args.rank, args.max_tokens = [0, 2], 4, 4, 4
        args.compile = "off"
    model = args.model or str(default_model_path())
    options: dict[str, Any] = {"dtype": args.dtype, "compile": args.compile}
    options |= {"max_num_seqs": args.concurrency, "max_model_len": 512}
    base = LLM(model, **options)
    prompts = [list(base.get_tokenizer().encode(f"{i}. {PROMPT}")) for i in range(args.concurrency)]
    base_rate = rate(base, prompts, [None] * len(prompts), args)
    base.shutdown()
    del base
    most = max(args.adapters)
    lora = LLM(
        model,
        enable_lora=True,
        max_loras=max(1, most),
        max_lora_rank=max(args.rank, args.max_lora_rank),
        **options,
    )
    config = lora.engine.model_config
    with tempfile.TemporaryDirectory() as scratch:
        paths = [random_adapter(Path(scratch) / f"a{i}", config, args.rank, i) for i in range(most)]
        requests = [LoRARequest(f"a{i}", i + 1, str(p)) for i, p in enumerate(paths)]
        for k in args.adapters:
            loras = [None if k == 0 else requests[i % k] for i in range(len(prompts))]
            tok_s = rate(lora, prompts, loras, args)
            print(
                f"lora adapters={k} concurrency={args.concurrency} rank={args.rank}: "
                f"{tok_s:.1f} tok/s, {tok_s / base_rate:.2f}x the base ({base_rate:.1f} tok/s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
