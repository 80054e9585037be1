"""One sampling step on CPU: ferrollm's `Sampler.sample` against the same math in torch, the way
vLLM writes it (penalties by scatter/gather over dense masks, temperature, sort-based
`apply_top_k_top_p`, softmax, `torch.multinomial`), with torch on as many threads as rayon.

Configurations: rows 1/64/256 x vocab 49152/151936, "filtered" (top-k 50, top-p 0.9,
temperature 0.8, repetition 1.1, presence 0.5, frequency 0.5 over 256-token prompts and 256-token
outputs) and "greedy" (the same penalties, temperature 0; both sides must pick the same tokens).
One line per configuration: best-of-`repeats` ms per step for both, and torch / ferrollm.

Usage: python benches/sampler.py [--rows 1 64 256] [--vocabs 49152 151936] [--repeats N]
                                  [--min-time S] [--smoke]
  --smoke   rows 1, vocab 49152, 1 short repeat: that the bench still runs (the test suite
            runs it)
"""

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch

from ferrollm import SamplingParams
from ferrollm.testing import Sampler

HISTORY = 256
REPETITION, PRESENCE, FREQUENCY = 1.1, 0.5, 0.5
TOP_K, TOP_P, TEMPERATURE = 50, 0.9, 0.8
#: --smoke: the smallest configuration, filtered and greedy, timed briefly.
SMOKE = {"rows": [1], "vocabs": [49152], "repeats": 1, "min_time": 0.01}


def bin_counts(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Per-row token counts, [rows, vocab] (vLLM's `_get_bin_counts_and_mask`)."""
    counts = torch.zeros((tokens.shape[0], vocab), dtype=torch.long)
    counts.scatter_add_(1, tokens, torch.ones_like(tokens))
    return counts


def torch_penalties(logits: torch.Tensor, prompt: torch.Tensor, output: torch.Tensor) -> None:
    vocab = logits.shape[1]
    out_counts = bin_counts(output, vocab)
    out_mask = out_counts > 0
    seen = (bin_counts(prompt, vocab) > 0) | out_mask
    rep = torch.full_like(logits, REPETITION)
    rep[~seen] = 1.0
    logits.copy_(torch.where(logits > 0, logits / rep, logits * rep))
    # One subtraction of (frequency * count + presence), the sampler's float order.
    logits -= FREQUENCY * out_counts.to(logits.dtype) + PRESENCE * out_mask.to(logits.dtype)


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """vLLM's sort-based top-k/top-p."""
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    kth = logits_sort.gather(1, (logits_sort.size(1) - k).unsqueeze(1))
    logits_sort.masked_fill_(logits_sort < kth, -float("inf"))
    probs_sum = logits_sort.softmax(dim=-1).cumsum(dim=-1)
    top_p_mask = probs_sum <= 1 - p.unsqueeze(1)
    top_p_mask[:, -1] = False
    logits_sort.masked_fill_(top_p_mask, -float("inf"))
    return logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)


def torch_step(
    logits: torch.Tensor, prompt: torch.Tensor, output: torch.Tensor, greedy: bool
) -> torch.Tensor:
    x = logits.clone()  # the engine's logits are read-only for the sampler on both sides
    torch_penalties(x, prompt, output)
    if greedy:
        return x.argmax(dim=-1)
    x.div_(TEMPERATURE)
    rows = x.shape[0]
    k = torch.full((rows,), TOP_K, dtype=torch.long)
    x = apply_top_k_top_p(x, k, torch.full((rows,), TOP_P))
    return torch.multinomial(x.softmax(dim=-1), 1).squeeze(1)


def best_ms(fn: Callable[[], object], repeats: int, min_time: float) -> float:
    """Best mean ms per call over `repeats` timed runs of at least `min_time` seconds each."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        best = min(best, elapsed / calls)
    return best * 1e3


def bench(rows: int, vocab: int, greedy: bool, repeats: int, min_time: float) -> None:
    rng = np.random.default_rng(rows * vocab)
    logits = ((rng.random((rows, vocab)) + rng.random((rows, vocab)) - 1.0) * 6.0).astype(
        np.float32
    )
    prompt = rng.integers(0, vocab, (rows, HISTORY), dtype=np.uint32)
    output = rng.integers(0, vocab, (rows, HISTORY), dtype=np.uint32)
    p = SamplingParams(
        temperature=0.0 if greedy else TEMPERATURE,
        top_k=-1 if greedy else TOP_K,
        top_p=1.0 if greedy else TOP_P,
        repetition_penalty=REPETITION,
        presence_penalty=PRESENCE,
        frequency_penalty=FREQUENCY,
    )
    sampler = Sampler()
    args = (
        logits, np.arange(rows), [p] * rows, list(prompt), list(output),
        np.arange(rows, dtype=np.uint64),
    )  # fmt: skip
    t_logits = torch.from_numpy(logits)
    t_prompt, t_output = (
        torch.from_numpy(prompt.astype(np.int64)),
        torch.from_numpy(output.astype(np.int64)),
    )
    ours = sampler.sample(*args).token_ids
    theirs = torch_step(t_logits, t_prompt, t_output, greedy).numpy()
    if greedy:
        assert np.array_equal(ours, theirs), "greedy tokens differ between ferrollm and torch"
    ms_ours = best_ms(lambda: sampler.sample(*args), repeats, min_time)
    ms_torch = best_ms(lambda: torch_step(t_logits, t_prompt, t_output, greedy), repeats, min_time)
    name = "greedy" if greedy else "filtered"
    print(
        f"sampler.py {name:8s} rows={rows:<3d} vocab={vocab:<6d} ferrollm_ms={ms_ours:8.3f} "
        f"torch_ms={ms_torch:9.3f} speedup={ms_torch / ms_ours:6.1f}x",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--vocabs", type=int, nargs="+", default=[49152, 151936])
    parser.add_argument("--smoke", action="store_true", help="rows 1, vocab 49152, 1 repeat")
    args = parser.parse_args()
    if args.smoke:  # the smallest sizes; flags given still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    threads = Sampler().num_threads
    torch.set_num_threads(threads)
    print(f"sampler.py threads={threads} (rayon and torch)")
    for vocab in args.vocabs:
        for rows in args.rows:
            for greedy in (False, True):
                bench(rows, vocab, greedy, args.repeats, args.min_time)


if __name__ == "__main__":
    main()
