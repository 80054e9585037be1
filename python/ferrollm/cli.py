"""``ferrollm serve [MODEL] [options]``: the HTTP server on Granian (one worker).
``ferrollm make-smolvlm-demo OUT_DIR [--seed N]``: write the SmolVLM-shaped demo checkpoint
(`ferrollm.multimodal.demo`).
``ferrollm bench serve|throughput|latency|plot``: benchmarks (`ferrollm.bench`,
docs/benchmarks.md).

With ``--tensor-parallel-size N`` the server process spawns N - 1 workers on this node; on
several nodes, start every rank with torch's launcher environment (``MASTER_ADDR``,
``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``) and the same options: rank 0 serves, a process with
``RANK`` > 0 runs the worker loop instead (``ferrollm.distributed.worker``).

Options come from built-in defaults, then ``--config FILE.json`` (a JSON object whose keys
mirror the flags: ``max_num_seqs`` or ``max-num-seqs``), then the flags given. The parent
process only parses and checks them, and opens the model's config and tokenizer (no torch:
`ferrollm.preflight`), so a bad model is one line and exit status 2 before any port is bound;
Granian's worker loads the model at lifespan startup and logs the model, device, dtype, KV
blocks and URL.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ferrollm import __version__
from ferrollm.bench import cli as bench_cli
from ferrollm.config import EngineConfigError, read_options_file
from ferrollm.preflight import PreflightError, check_serving
from ferrollm.server_config import split_options

#: Where the parent hands the options to Granian's worker.
OPTIONS_ENV = "FERROLLM_SERVE_OPTIONS"

# flag -> (option name, type, help); None type = a switch.
_FLAGS: dict[str, tuple[str, Any, str]] = {
    "--host": ("host", str, "address to listen on (default 127.0.0.1)"),
    "--port": ("port", int, "port to listen on (default 8000)"),
    "--served-model-name": ("served_model_name", str, "model name in requests and responses"),
    "--max-model-len": ("max_model_len", int, "prompt + output tokens per sequence"),
    "--max-num-seqs": ("max_num_seqs", int, "sequences per step at most"),
    "--max-num-batched-tokens": ("max_num_batched_tokens", int, "tokens per step at most"),
    "--max-num-encoder-tokens": (
        "max_num_encoder_tokens",
        int,
        "media tokens a step starts encoding (default max(batched tokens, 4096))",
    ),
    "--max-beam-width": ("max_beam_width", int, "widest beam search (default 8 on CPU)"),
    "--kv-cache-memory": ("kv_cache_memory", str, "KV-cache budget, e.g. 2GiB"),
    "--encoder-cache-memory": (
        "encoder_cache_memory",
        str,
        "a media model's encoder-output cache, e.g. 256MiB (the default); 0 keeps none",
    ),
    "--dtype": ("dtype", str, "auto, float32, bfloat16 or float16"),
    "--quantization": ("quantization", str, "weights: auto (keep the file's), none, int8, int4"),
    "--kv-cache-dtype": (
        "kv_cache_dtype",
        str,
        "auto (the compute dtype; bfloat16 on CPU with quantized weights), float32, bfloat16",
    ),
    "--compile": (
        "compile",
        str,
        "compiled decode steps (CPU: inductor, not for a dense float32 model; CUDA: CUDA graphs): "
        "auto, on, off",
    ),
    "--load-format": (
        "load_format",
        str,
        "weights: auto (read the checkpoint's), dummy (random; a directory's shape only)",
    ),
    "--device": ("device", str, "cpu, cuda or npu (default: detected)"),
    "--block-size": ("block_size", int, "tokens per KV-cache block"),
    "--max-input-tokens": ("max_input_tokens", int, "prompt tokens at most (maxInputTokenLen)"),
    "--max-iter-times": ("max_iter_times", int, "generated tokens at most (maxIterTimes)"),
    "--max-body-bytes": ("max_body_bytes", str, "largest request body (default 16MiB)"),
    "--full-text": ("full_text", None, "stream cumulative text (MindIE fullTextEnabled)"),
    "--text-offset-mode": ("text_offset_mode", str, "completions text_offset: openai or mindie"),
    "--seed": ("seed", int, "base seed of requests that give none (reproducible sampling)"),
    "--speculative": ("speculative", str, "ngram: prompt-lookup speculative decoding (off)"),
    "--num-speculative-tokens": ("num_speculative_tokens", int, "draft tokens per step (4)"),
    "--ngram-min": ("ngram_min", int, "shortest n-gram the drafter matches (1)"),
    "--ngram-max": ("ngram_max", int, "longest n-gram the drafter matches (3)"),
    "--tensor-parallel-size": (
        "tensor_parallel_size",
        int,
        "processes (devices) the model is split across (default 1); on several nodes, "
        "see docs/serving.md",
    ),
    "--distributed-timeout": (
        "distributed_timeout",
        float,
        "seconds a tensor-parallel rank may take to answer (default 300)",
    ),
    "--enable-lora": ("enable_lora", None, "serve LoRA adapters (a request's model picks one)"),
    "--max-loras": ("max_loras", int, "LoRA adapters running at once (default 1)"),
    "--max-cpu-loras": ("max_cpu_loras", int, "idle adapters kept loaded (default max-loras)"),
    "--max-lora-rank": ("max_lora_rank", int, "largest adapter rank (default 64)"),
    "--allow-runtime-lora-updating": (
        "allow_runtime_lora_updating",
        None,
        "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter",
    ),
    "--allowed-lora-path": (
        "allowed_lora_path",
        str,
        "the directory adapters loaded at run time must lie under",
    ),
    "--allowed-local-media-path": (
        "allowed_local_media_path",
        str,
        "the directory media parts may name server-local files under (default: none)",
    ),
    "--allowed-media-domains": (
        "allowed_media_domains",
        str,
        "HOST[,HOST...]: the only hosts media URLs are fetched from (default: any public host)",
    ),
    "--task": ("task", str, "generate (default) or embed (an embedding model, /v1/embeddings)"),
    "--pooling": ("pooling", str, "embed: mean, cls, last or max (default: as the model says)"),
    "--api-key-file": ("api_key_file", str, "file of API keys, one a line"),
    "--max-concurrent-per-key": ("max_concurrent_per_key", int, "in-flight requests per key"),
    "--request-timeout": ("request_timeout", float, "seconds a request may take (default none)"),
    "--max-waiting-requests": ("max_waiting_requests", int, "queued requests before 503"),
    "--max-waiting-tokens": ("max_waiting_tokens", int, "queued prompt tokens before 503"),
    "--ssl-certfile": ("ssl_certfile", str, "TLS certificate (PEM)"),
    "--ssl-keyfile": ("ssl_keyfile", str, "TLS private key (PEM)"),
    "--ssl-ca-certs": ("ssl_ca_certs", str, "CA bundle: require and verify client certificates"),
    "--tool-call-parser": (
        "tool_call_parser",
        str,
        "tool calls: auto (from the chat template), none, hermes, llama3_json, mistral or chatglm3",
    ),
    "--reasoning-parser": (
        "reasoning_parser",
        str,
        "<think> text as reasoning_content: auto (from the chat template), none, deepseek_r1 "
        "or qwen3",
    ),
    "--drain-timeout": ("drain_timeout", float, "seconds in-flight requests get after SIGTERM"),
    "--body-read-timeout": (
        "body_read_timeout",
        float,
        "seconds a client may take to send a request body (default 30; slower: 408)",
    ),
}
# Switches that turn a default-on option off: flag -> (option name, help).
_OFF_FLAGS: dict[str, tuple[str, str]] = {
    "--no-playground": ("playground", "do not serve the web playground at / (docs/serving.md)"),
}
# Repeatable flags: flag -> (option name, help).
_LIST_FLAGS: dict[str, tuple[str, str]] = {
    "--api-key": ("api_keys", "an API key clients must send as a Bearer token (repeatable)"),
    "--public-path": ("public_paths", "a path served without a key (repeatable; replaces the "
                      "default: health, metrics, /openapi.json)"),
    "--allowed-host": ("allowed_hosts", "a Host header name the server answers to (repeatable; "
                       "default: any); others get 400"),
}  # fmt: skip
# Flags taking several values after one flag (and repeatable): flag -> (option name, help).
_MULTI_FLAGS: dict[str, tuple[str, str]] = {
    "--lora-modules": ("lora_modules", "LoRA adapters to load: name=path ... (or JSON objects "
                       '{"name", "path", "base_model_name"}); needs --enable-lora'),
}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The ``ferrollm`` argument parser."""
    parser = argparse.ArgumentParser(prog="ferrollm", description="ferrollm LLM inference server")
    parser.add_argument("--version", action="version", version=f"ferrollm {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model over HTTP")
    serve.add_argument(
        "model", nargs="?", help="HF model directory or .gguf file (default: SmolLM2-135M)"
    )
    for flag, (name, kind, help_text) in _FLAGS.items():
        if kind is None:
            serve.add_argument(flag, dest=name, action="store_true", default=None, help=help_text)
        else:
            serve.add_argument(flag, dest=name, type=kind, default=None, help=help_text)
    for flag, (name, help_text) in _OFF_FLAGS.items():
        serve.add_argument(flag, dest=name, action="store_false", default=None, help=help_text)
    for flag, (name, help_text) in _LIST_FLAGS.items():
        serve.add_argument(flag, dest=name, action="append", default=None, help=help_text)
    for flag, (name, help_text) in _MULTI_FLAGS.items():
        serve.add_argument(
            flag, dest=name, nargs="+", action="extend", default=None, help=help_text
        )
    serve.add_argument("--config", type=Path, help="JSON file of options (keys mirror the flags)")
    serve.add_argument("--log-level", default="info", help="debug, info, warning or error")
    demo = commands.add_parser(
        "make-smolvlm-demo",
        help="write a SmolVLM-shaped checkpoint: the default SmolLM2 decoder plus a random, "
        "seeded vision tower (nothing is fetched)",
    )
    demo.add_argument("out_dir", type=Path, help="directory to write (created)")
    demo.add_argument("--seed", type=int, default=0, help="the vision weights' seed")
    demo.add_argument(
        "--gguf", type=Path, default=None, help="the SmolLM2 GGUF (default: the default model)"
    )
    bench_cli.add_parser(commands)
    return parser


def serve_options(args: argparse.Namespace) -> dict[str, Any]:
    """The merged options: the config file's, overridden by the flags given."""
    options: dict[str, Any] = {}
    if args.config is not None:
        options.update({k.replace("-", "_"): v for k, v in read_options_file(args.config).items()})
    if args.model is not None:
        options["model"] = args.model
    names = [n for n, _, _ in _FLAGS.values()]
    names += [n for n, _ in (*_OFF_FLAGS.values(), *_LIST_FLAGS.values(), *_MULTI_FLAGS.values())]
    for name in names:
        value = getattr(args, name)
        if value is not None:
            options[name] = value
    split_options(options)  # check everything before any process starts
    return options


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ferrollm`` and ``python -m ferrollm``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "make-smolvlm-demo":
        return _make_smolvlm_demo(args)
    if args.command == "bench":
        return bench_cli.main(args)
    if _worker_rank() is not None:  # a tensor-parallel rank > 0 of a launcher-placed group
        from ferrollm.distributed.worker import exit_now, run_worker

        exit_now(run_worker(lambda: split_options(serve_options(args))[0]))
    try:
        options = serve_options(args)
    except EngineConfigError as e:
        parser.error(str(e))
    model = options.get("model")
    if model is not None and not Path(model).exists():
        parser.error(f"model path {model!r} does not exist")
    try:
        check_serving(split_options(options)[0])  # before any port is bound
    except PreflightError as e:
        if args.log_level == "debug":
            traceback.print_exception(e)
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    return _run_granian(options, args.log_level)


def _make_smolvlm_demo(args: argparse.Namespace) -> int:
    from ferrollm.multimodal.demo import build_smolvlm_demo

    out = build_smolvlm_demo(args.out_dir, seed=args.seed, gguf_path=args.gguf)
    print(f"wrote the SmolVLM demo checkpoint to {out}")
    return 0


def _worker_rank() -> int | None:
    """``RANK`` when torch's launcher environment makes this process a rank > 0 (it runs the
    worker loop then, not a server); None otherwise (rank 0 checks the environment itself)."""
    if not all(name in os.environ for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")):
        return None
    rank = os.environ.get("RANK", "")
    return int(rank) if rank.isdigit() and int(rank) > 0 else None


def _run_granian(options: dict[str, Any], log_level: str) -> int:
    from granian import Granian
    from granian.constants import Interfaces
    from granian.log import LogLevels

    from ferrollm.server.transport import granian_options

    _, server = split_options(options)
    os.environ[OPTIONS_ENV] = json.dumps(options)
    Granian(
        "ferrollm.server.main:app_from_env",
        address=server.host,
        port=server.port,
        interface=Interfaces.ASGI,
        workers=1,
        factory=True,
        log_level=LogLevels(log_level),
        **granian_options(server),
    ).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
