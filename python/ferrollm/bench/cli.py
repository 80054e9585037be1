"""``ferrollm bench serve|throughput|latency|plot``: the parser and what each command runs.

`add_parser` registers ``bench`` on the ``ferrollm`` parser (ferrollm/cli.py's one call site);
`main` runs the parsed command. Flag names follow ``vllm bench``'s where they overlap, so one
command line measures ferrollm, llama-server or vLLM (docs/benchmarks.md). Nothing here
imports httpx, matplotlib or torch: each command imports what it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ferrollm.bench.datasets import DatasetError

METRICS = ("ttft", "tpot", "itl", "e2el")
#: Engine options of the offline commands: flag -> (EngineConfig field, type, help).
ENGINE_FLAGS: dict[str, tuple[str, Callable[[str], Any], str]] = {
    "--device": ("device", str, "cpu, cuda or npu (default: detected)"),
    "--dtype": ("dtype", str, "auto, float32, bfloat16 or float16"),
    "--quantization": ("quantization", str, "auto, none, int8 or int4"),
    "--compile": ("compile", str, "compiled decode steps: auto, on or off"),
    "--max-model-len": ("max_model_len", int, "prompt + output tokens per sequence"),
    "--max-num-seqs": ("max_num_seqs", int, "sequences per step at most"),
    "--max-num-batched-tokens": ("max_num_batched_tokens", int, "tokens per step at most"),
    "--kv-cache-memory": ("kv_cache_memory", str, "KV-cache budget, e.g. 2GiB"),
}


def add_parser(commands: Any) -> None:
    """Add ``bench`` and its subcommands to the ``ferrollm`` subparsers ``commands``."""
    bench = commands.add_parser("bench", help="benchmark a server or the offline engine")
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    _add_serve(kinds.add_parser("serve", help="load-test any OpenAI-compatible server"))
    _add_throughput(kinds.add_parser("throughput", help="offline: all prompts at once"))
    _add_latency(kinds.add_parser("latency", help="offline: one batch's latency"))
    plot = kinds.add_parser("plot", help="plot (and overlay) bench serve result files")
    for parser in kinds.choices.values():  # errors found after parsing name the subcommand
        parser.set_defaults(bench_parser=parser)
    plot.add_argument("files", nargs="+", type=Path, help="result JSON files")
    plot.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        help="where the PNGs and HTML go (default: the first file's folder)",
    )
    plot.add_argument(
        "--name",
        default=None,
        help="file name stem (default: the first file's, plus -vs-... per file)",
    )


def _add_serve(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server's URL")
    p.add_argument(
        "--endpoint", default="/v1/completions", choices=("/v1/completions", "/v1/chat/completions")
    )
    p.add_argument("--model", default=None, help="model id (default: first of GET /v1/models)")
    p.add_argument("--label", default="server", help="this run's name in results and plots")
    _add_dataset(p, input_len=1024, output_len=128)
    p.add_argument(
        "--random-range-ratio",
        type=_ratio,
        default=0.0,
        help="lengths uniform in len * [1 - r, 1 + r] (default 0)",
    )
    p.add_argument("--num-prompts", type=_positive_int, default=1000, help="requests per level")
    p.add_argument(
        "--max-concurrency",
        type=_concurrency_list,
        default=[None],
        help="requests in flight at most; a comma list (1,4,16) sweeps, one run "
        "per level (default: no limit)",
    )
    p.add_argument(
        "--request-rate",
        type=_rate,
        default=math.inf,
        help="requests/s, Poisson arrivals seeded by --seed (default inf: all at once)",
    )
    p.add_argument(
        "--num-warmups",
        type=_non_negative_int,
        default=0,
        help="requests sent one by one before the measured ones",
    )
    p.add_argument("--ignore-eos", action="store_true", help="ask for ignore_eos (exact lengths)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0)")
    p.add_argument(
        "--goodput",
        nargs="+",
        type=_slo,
        default=None,
        metavar="METRIC:MS",
        help="SLOs, e.g. ttft:200 itl:50 (ttft, tpot, itl, e2el); goodput is the "
        "requests/s meeting all of them",
    )
    p.add_argument(
        "--percentile-metrics",
        type=_metric_list,
        default=list(METRICS),
        help="comma list of ttft, tpot, itl, e2el (default: all)",
    )
    p.add_argument(
        "--metric-percentiles",
        type=_percentile_list,
        default=[99.0],
        help="comma list of percentiles, e.g. 50,90,99 (default 99)",
    )
    p.add_argument("--save-result", action="store_true", help="write the JSON and the plots")
    p.add_argument("--result-dir", type=Path, default=Path("."), help="where they go (.)")
    p.add_argument(
        "--result-filename", default=None, help="the JSON's name (default: LABEL-MODEL-DATE.json)"
    )
    p.add_argument("--no-plots", action="store_true", help="save the JSON only")
    p.add_argument("--disable-tqdm", action="store_true", help="no progress output")


def _add_dataset(p: argparse.ArgumentParser, input_len: int, output_len: int) -> None:
    p.add_argument(
        "--dataset-name",
        default="random",
        choices=("random", "jsonl"),
        help='random word prompts, or a JSONL file of {"prompt", "output_len"}',
    )
    p.add_argument("--dataset-path", type=Path, default=None, help="the JSONL file")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="prompts and arrivals (default: random, recorded in the result)",
    )
    for flag, default, what in (
        ("input", input_len, "prompt words"),
        ("output", output_len, "output tokens"),
    ):
        p.add_argument(
            f"--random-{flag}-len",
            type=_positive_int,
            default=default,
            help=f"{what} per request (default {default})",
        )


def _add_offline(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF directory or .gguf (default: SmolLM2-135M)")
    for flag, (name, kind, help_text) in ENGINE_FLAGS.items():
        p.add_argument(flag, dest=name, type=kind, default=None, help=help_text)
    p.add_argument("--output-json", type=Path, default=None, help="write the results here")


def _add_throughput(p: argparse.ArgumentParser) -> None:
    _add_offline(p)
    _add_dataset(p, input_len=128, output_len=128)
    p.add_argument("--num-prompts", type=_positive_int, default=100, help="prompts (100)")


def _add_latency(p: argparse.ArgumentParser) -> None:
    _add_offline(p)
    p.add_argument("--input-len", type=_positive_int, default=32, help="prompt tokens (32)")
    p.add_argument("--output-len", type=_positive_int, default=128, help="output tokens (128)")
    p.add_argument("--batch-size", type=_positive_int, default=8, help="prompts per batch (8)")
    p.add_argument("--num-iters-warmup", type=_non_negative_int, default=2, help="untimed (2)")
    p.add_argument("--num-iters", type=_positive_int, default=10, help="timed runs (10)")
    p.add_argument("--seed", type=int, default=0, help="the prompts' words (0)")


def main(args: argparse.Namespace) -> int:
    """Run the parsed ``bench`` command; bad combinations of flags are argparse errors."""
    parser: argparse.ArgumentParser = args.bench_parser
    if getattr(args, "dataset_name", None) == "jsonl" and args.dataset_path is None:
        parser.error("--dataset-name jsonl needs --dataset-path")
    if getattr(args, "seed", 0) is None:
        args.seed = random.randrange(1 << 31)
    command = {"serve": _serve, "throughput": _throughput, "latency": _latency, "plot": _plot}
    try:
        return command[args.bench_command](args)
    except (DatasetError, OSError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")


def _serve(args: argparse.Namespace) -> int:
    import httpx

    from ferrollm.bench.loadgen import ClientConfig
    from ferrollm.bench.metrics import MetricOptions
    from ferrollm.bench.serve import (
        DatasetConfig,
        ServeConfig,
        default_filename,
        resolve_model,
        run_serve,
        write_result,
    )

    try:
        model = asyncio.run(resolve_model(args.base_url, args.model))
    except httpx.HTTPError as e:
        raise OSError(f"{args.base_url}: cannot list the models ({e}); pass --model") from e
    dataset = DatasetConfig(
        args.dataset_name,
        None if args.dataset_path is None else str(args.dataset_path),
        args.random_input_len,
        args.random_output_len,
        args.random_range_ratio,
    )
    config = ServeConfig(
        client=ClientConfig(args.base_url, model, args.endpoint, args.ignore_eos, args.temperature),
        dataset=dataset,
        num_prompts=args.num_prompts,
        max_concurrency=args.max_concurrency,
        request_rate=args.request_rate,
        seed=args.seed,
        num_warmups=args.num_warmups,
        metrics=MetricOptions(
            args.percentile_metrics, args.metric_percentiles, dict(args.goodput or ())
        ),
        label=args.label,
    )
    document = asyncio.run(run_serve(config, quiet=args.disable_tqdm))
    if args.save_result:
        path = args.result_dir / (args.result_filename or default_filename(document))
        print(f"wrote {write_result(document, path)}")
        if not args.no_plots:
            _write_plots([document], args.result_dir, path.stem)
    return 0


def _plot(args: argparse.Namespace) -> int:
    from ferrollm.bench.serve import load_result

    documents = [load_result(path) for path in args.files]
    labels = [d["label"] for d in documents]
    for document, path in zip(documents, args.files, strict=True):
        if labels.count(document["label"]) > 1:  # same label twice: tell the files apart
            document["label"] = f"{document['label']} ({path.stem})"
    stem = args.name or "-vs-".join(path.stem for path in args.files)
    _write_plots(documents, args.output_dir or args.files[0].parent, stem)
    return 0


def _write_plots(documents: list[dict[str, Any]], out_dir: Path, stem: str) -> None:
    from ferrollm.bench.plots import save_plots

    for path in save_plots(documents, out_dir, stem).values():
        print(f"wrote {path}")


def _throughput(args: argparse.Namespace) -> int:
    from ferrollm.bench.offline import run_throughput
    from ferrollm.bench.serve import DatasetConfig

    dataset = DatasetConfig(
        args.dataset_name,
        None if args.dataset_path is None else str(args.dataset_path),
        args.random_input_len,
        args.random_output_len,
    )
    requests = dataset.requests(args.num_prompts, args.seed, 0, 0)
    input_len = args.random_input_len if args.dataset_name == "random" else None
    result = run_throughput(_llm(args), requests, input_len)
    print(
        f"Throughput: {result['requests_per_second']:.2f} requests/s, "
        f"{result['tokens_per_second']:.2f} total tokens/s, "
        f"{result['output_tokens_per_second']:.2f} output tokens/s"
    )
    _write_json(args.output_json, {**result, "model": args.model, "seed": args.seed})
    return 0


def _latency(args: argparse.Namespace) -> int:
    from ferrollm.bench.datasets import random_requests
    from ferrollm.bench.offline import run_latency

    requests = random_requests(args.batch_size, args.input_len, args.output_len, 0.0, args.seed)
    result = run_latency(
        _llm(args),
        requests,
        args.input_len,
        args.output_len,
        args.num_iters_warmup,
        args.num_iters,
    )
    print(f"Avg latency: {result['avg_latency']:.4f} s")
    for q, value in result["percentiles"].items():
        print(f"{q}% percentile latency: {value:.4f} s")
    _write_json(args.output_json, {**result, "model": args.model})
    return 0


def _llm(args: argparse.Namespace) -> Any:
    from ferrollm.llm import LLM

    options = {name: getattr(args, name) for name, _, _ in ENGINE_FLAGS.values()}
    return LLM(args.model, **{k: v for k, v in options.items() if v is not None})


def _write_json(path: Path | None, result: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path}")


# Argument types: a ValueError or ArgumentTypeError becomes argparse's "invalid value" error.


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more; got {text}")
    return value


def _ratio(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1); got {text}")
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 requests/s, or inf; got {text}")
    return value


def _concurrency_list(text: str) -> list[int | None]:
    return [_positive_int(part) for part in text.split(",")]


def _metric_list(text: str) -> list[str]:
    metrics = text.split(",")
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown metric {unknown[0]!r}; known: {', '.join(METRICS)}"
        )
    return metrics


def _percentile_list(text: str) -> list[float]:
    values = [float(part) for part in text.split(",")]
    if not all(0 < v <= 100 for v in values):
        raise argparse.ArgumentTypeError(f"percentiles must be in (0, 100]; got {text}")
    return values


def _slo(text: str) -> tuple[str, float]:
    name, sep, ms = text.partition(":")
    if not sep or name not in METRICS:
        raise argparse.ArgumentTypeError(
            f"expected METRIC:MS with METRIC one of {', '.join(METRICS)}; got {text!r}"
        )
    value = float(ms)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"an SLO must be > 0 ms; got {text!r}")
    return name, value
