"""Constrained decoding backends side by side on the same tokenizer and schema: ferrollm's
(llguidance, through ``cargo bench --bench grammar`` over the default model's tokenizer),
xgrammar and outlines-core when they are installed (neither is a dependency:
``pip install xgrammar apache-tvm-ffi outlines-core`` into a scratch directory and put it on
PYTHONPATH). Each line: the grammar's compile time and the time of one decoding step (every
row's allowed-token mask, then one allowed token consumed) for 1 and 32 rows; the same
10-property JSON schema as ``benches/structured.py``, compact JSON (no free whitespace).

ferrollm's step is criterion's median and includes picking the token; xgrammar's and
outlines-core's time only their mask and advance calls (the Python pick is left out), with
xgrammar's batch matcher filling the 32 rows' masks on its thread pool.

``--smoke``: ferrollm's bench built with the dev profile (the release build takes minutes;
`make test-rust` has built the debug one) in criterion's quick mode, 4 steps for the others:
that the bench still runs (the test suite runs it); ferrollm's times are a debug build's.

Usage: python benches/grammar_backends.py [--steps 400] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ferrollm.default_model import default_model_path
from ferrollm.executor.loader import load_model_source

sys.path.insert(0, str(Path(__file__).parent))
from structured import SCHEMA

ROOT = Path(__file__).resolve().parent.parent
#: Criterion's filter: the real tokenizer's 1- and 32-row steps, the two that are compared.
FILTER = r"tokenizer\d+/rows(1|32)$"
#: --smoke: a few steps of the Python backends (ferrollm's side is `--smoke` below).
SMOKE = {"steps": 4}


def ferrollm_line(tokenizer_json: str, eos: int, smoke: bool) -> str:
    """Run the criterion bench over the tokenizer; its rows-1 and rows-32 medians. ``smoke``:
    the debug build, criterion's quick mode."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(tokenizer_json)
    env = {**os.environ, "FERROLLM_BENCH_TOKENIZER": f.name, "FERROLLM_BENCH_EOS": str(eos)}
    command = ["cargo", "bench", "--quiet", "--bench", "grammar"]
    if smoke:
        command += ["--profile", "dev"]
    command += ["--", FILTER, *(["--quick"] if smoke else [])]
    out = subprocess.run(
        command,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    os.unlink(f.name)
    found = dict(re.findall(r"tokenizer\d+/rows(\d+)\s+time:\s+\[\S+ \S+ (\S+ \S+)", out))
    return f"rows1={found.get('1', '?')} rows32={found.get('32', '?')}"


def timed_walk(
    rows: int,
    steps: int,
    fill: Callable[[], None],
    allowed: Callable[[int], np.ndarray],
    advance: Callable[[int, int], bool],
    reset: Callable[[int], None],
) -> float:
    """Mean seconds per step of ``steps`` steps (mask fill + advance timed, the pick not)."""
    rng = random.Random(0)
    spent = 0.0
    for _ in range(steps):
        start = time.perf_counter()
        fill()
        spent += time.perf_counter() - start
        for r in range(rows):
            ids = allowed(r)
            token = int(ids[rng.randrange(len(ids))]) if len(ids) else -1
            start = time.perf_counter()
            ended = token < 0 or advance(r, token)
            spent += time.perf_counter() - start
            if ended:
                reset(r)
    return spent / steps


def xgrammar_line(vocab: list[bytes], eos: int, steps: int) -> str:
    import xgrammar as xgr

    info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, stop_token_ids=[eos])
    compiler = xgr.GrammarCompiler(info)
    start = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), separators=(", ", ": "))
    compile_ms = 1000 * (time.perf_counter() - start)
    out = [f"compile={compile_ms:.1f}ms"]
    for rows in (1, 32):
        matchers = [xgr.GrammarMatcher(compiled) for _ in range(rows)]
        bitmask = xgr.allocate_token_bitmask(rows, len(vocab)).numpy()
        batch = xgr.BatchGrammarMatcher()

        def fill(
            matchers: list[Any] = matchers, bitmask: np.ndarray = bitmask, batch: Any = batch
        ) -> None:
            if len(matchers) == 1:
                matchers[0].fill_next_token_bitmask(bitmask, 0)
            else:
                batch.batch_fill_next_token_bitmask(matchers, bitmask)

        def allowed(r: int, bitmask: np.ndarray = bitmask) -> np.ndarray:
            bits = np.unpackbits(bitmask[r].view(np.uint8), bitorder="little")[: len(vocab)]
            ids = np.flatnonzero(bits)
            return ids[ids != eos] if len(ids) > 1 else ids

        def advance(r: int, token: int, matchers: list[Any] = matchers) -> bool:
            return (
                token == eos or not matchers[r].accept_token(token) or matchers[r].is_terminated()
            )

        def reset(r: int, matchers: list[Any] = matchers) -> None:
            matchers[r].reset()

        per_step = timed_walk(rows, steps, fill, allowed, advance, reset)
        out.append(f"rows{rows}={1e6 * per_step:.1f} us")
    return " ".join(out)


def outlines_line(vocab: list[bytes], eos: int, steps: int) -> str:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    tokens: dict[bytes, list[int]] = {}
    for i, t in enumerate(vocab):
        if i != eos and t:
            tokens.setdefault(t, []).append(i)
    start = time.perf_counter()
    regex = build_regex_from_schema(json.dumps(SCHEMA), r"")
    index = Index(regex, Vocabulary(eos, tokens))
    compile_ms = 1000 * (time.perf_counter() - start)
    out = [f"compile={compile_ms:.1f}ms"]
    for rows in (1, 32):
        guides = [Guide(index) for _ in range(rows)]
        masks: list[list[int]] = [[] for _ in range(rows)]

        def fill(guides: list[Any] = guides, masks: list[list[int]] = masks) -> None:
            for r, g in enumerate(guides):
                masks[r] = g.get_tokens()

        def allowed(r: int, masks: list[list[int]] = masks) -> np.ndarray:
            ids = np.asarray(masks[r])
            return ids[ids != eos] if len(ids) > 1 else ids

        def advance(r: int, token: int, guides: list[Any] = guides) -> bool:
            if token == eos:
                return True
            guides[r].advance(token)
            return bool(guides[r].is_finished())

        def reset(r: int, guides: list[Any] = guides) -> None:
            guides[r].reset()

        per_step = timed_walk(rows, steps, fill, allowed, advance, reset)
        out.append(f"rows{rows}={1e6 * per_step:.1f} us")
    return " ".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--smoke", action="store_true", help="debug build, quick, 4 steps")
    args = parser.parse_args()
    if args.smoke:  # the smallest sizes; flags given still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    source = load_model_source(default_model_path())
    from ferrollm.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_source(source)
    detok = tokenizer.detokenizer
    eos = source.special_tokens.eos_token_id or 0
    vocab = [detok.token_bytes(i) for i in range(detok.vocab_size)]
    print(f"# default model's tokenizer ({len(vocab)} ids), 10-property JSON schema")
    ours = ferrollm_line(source.tokenizer_json, eos, args.smoke)
    print(f"grammar_backends backend=ferrollm-llguidance {ours}")
    for name, line in (("xgrammar", xgrammar_line), ("outlines-core", outlines_line)):
        try:
            result = line(vocab, eos, args.steps)
        except ImportError:
            result = "not installed"
        print(f"grammar_backends backend={name} {result}")


if __name__ == "__main__":
    main()
