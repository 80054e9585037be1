"""Stop strings per text delta: the Rust StopMatcher through the binding vs the windowed
`str.find` algorithm vLLM uses, in pure Python, on the same ~8 KB text that never completes a
stop (the steady state, though it often starts one). One line per (stops, delta size).

The Python side gets its best case: the text is a local variable (CPython appends in place)
and the loop is inline, with no method call per delta. The Rust matcher's per-request setup
(compiling the stop strings) is timed apart from the per-delta cost and printed as `setup_us`.

Usage: python benches/stop.py [--repeats N] [--smoke]
  --smoke   1 repeat: that the bench still runs (the test suite runs it)
"""

import argparse
import random
import time
from collections.abc import Callable

from ferrollm import StopMatcher
from ferrollm.testing import truncate_at_stop

TEXT_CHARS = 8192
#: --smoke: every case once (the whole text is the smallest workload that covers a case).
SMOKE = {"repeats": 1}

COMMON_STOPS = [
    "<|im_end|>",
    "\n\nUser:",
    "</s>",
    "###",
    "<|eot_id|>",
    "\n\nHuman:",
    "Observation:",
    "<|endoftext|>",
    "[/INST]",
    "<|end|>",
    "\n\n\n",
    "STOP",
    "~",
    ";;",
    "<|im_start|>",
    "\nQ:",
]

WORDS = ["the", "model", "answer", "is", "User", "tokens", "of", "a", "stream", "<|im", "#1"]
WORDS += ["Human", "[/x]", "end", "STO", "Observation"]


def stop_set(n: int) -> list[str]:
    """The first `n` common stops, then generated ones of 1 to 32 chars (as benches/stop.rs)."""
    stops = COMMON_STOPS[:n]
    for i in range(max(0, n - len(COMMON_STOPS))):
        generated = [f"<|reserved_special_token_{i}|>", f"\n\nAnswer {i}:", f"END{i}"]
        generated.append(["^", "@@", "$$$", "|>>"][i // 4 % 4])
        stops.append(generated[i % 4])
    return stops


def make_text() -> str:
    """Words, sentences and single newlines: starts of stops, never a whole one."""
    rng = random.Random(7)
    parts, size = [], 0
    while size < TEXT_CHARS:
        part = rng.choice(WORDS) + rng.choice([". ", "\n", ", "] + [" "] * 9)
        parts.append(part)
        size += len(part)
    return "".join(parts)


def run_rust(m: StopMatcher, deltas: list[str]) -> str:
    push = m.push
    out = [push(delta)[0] for delta in deltas]
    out.append(m.finish())
    return "".join(out)


def run_windowed(stop: list[str], deltas: list[str]) -> str:
    """vLLM's check: search each stop from just before the new delta; hold back the last
    `max_stop_len - 1` chars until the text ends."""
    hold = max(map(len, stop), default=1) - 1
    text, emitted, out = "", 0, []
    for delta in deltas:
        text += delta
        for s in stop:
            at = text.find(s, max(0, len(text) - len(delta) - len(s) + 1))
            if at != -1:
                out.append(text[emitted:at])
                return "".join(out)
        end = len(text) - hold
        if end > emitted:
            out.append(text[emitted:end])
            emitted = end
    out.append(text[emitted:])
    return "".join(out)


def timed(run: Callable[..., object], *args: object) -> float:
    start = time.perf_counter()
    run(*args)
    return time.perf_counter() - start


def compare(stop: list[str], deltas: list[str], repeats: int) -> tuple[float, float, float]:
    """Best times over `repeats` (the two sides alternate, so load hits both alike): Rust setup
    in µs, then µs per delta for Rust and for the windowed Python."""
    setup = rust = python = float("inf")
    for _ in range(repeats):
        setup = min(setup, timed(StopMatcher, stop))
        rust = min(rust, timed(run_rust, StopMatcher(stop), deltas))
        python = min(python, timed(run_windowed, stop, deltas))
    return setup * 1e6, rust / len(deltas) * 1e6, python / len(deltas) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="1 repeat")
    args = parser.parse_args()
    if args.smoke:  # the smallest sizes; flags given still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    text = make_text()
    for num_stops in (0, 4, 16, 100):
        stop = stop_set(num_stops)
        assert truncate_at_stop(text, stop)[1] is None
        for delta_chars in (1, 32):
            deltas = [text[i : i + delta_chars] for i in range(0, len(text), delta_chars)]
            assert run_rust(StopMatcher(stop), deltas) == run_windowed(stop, deltas) == text
            setup, rust, python = compare(stop, deltas, args.repeats)
            print(
                f"stop.py stops={num_stops} delta_chars={delta_chars} "
                f"rust_us_per_delta={rust:.3f} python_us_per_delta={python:.3f} "
                f"speedup={python / rust:.1f}x setup_us={setup:.1f}"
            )


if __name__ == "__main__":
    main()
