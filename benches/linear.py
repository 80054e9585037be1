"""Weight-only matmuls on the CPU: int4 / int8 / bfloat16 / float32 at the default model's shapes.

For each of SmolLM2-135M's projections (fused qkv, o, fused gate/up, down, the tied LM head)
and M = 1, 8, 32, 256 rows, one line per (shape, M) with the best-of-N time of each weight
format and the bandwidth it achieved reading its weights, against a measured memory-copy
bandwidth of this machine (a 256 MiB ``copy_``, read + write bytes):

  linear shape=qkv K=576 N=960 M=1 f32_us=.. bf16_us=.. int8_us=.. int4_us=.. f32_GBs=..
         bf16_GBs=.. int8_GBs=.. int4_GBs=.. best=int4
  linear copy_bandwidth_GBs=..

int4 is ``aten._weight_int4pack_mm_for_cpu`` (group 32), int8 ``aten._weight_int8pack_mm``
(per-channel scales); both run with bfloat16 activations, as the engine runs them
(``ferrollm.layers.quant``). float32 and bfloat16 are ``F.linear``; bf16pk is the bfloat16
weight reordered for oneDNN (``ferrollm.layers.linear.prepack_dense``, what quantized layers
keep as their copy for many-row calls), where torch has oneDNN.

Usage: python benches/linear.py [--m 1 8 32 256] [--shapes qkv o ...] [--repeats 50]
                                 [--threads N] [--smoke]
  --smoke   shape qkv, M = 1, 3 repeats: that the bench still runs (the test suite runs it)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ferrollm.layers.linear import onednn_linear, prepack_dense
from ferrollm.layers.quant import QuantizedWeight, quantize_rtn

#: (name, K = in features, N = out features) of SmolLM2-135M's matmuls.
SHAPES = (
    ("qkv", 576, 960),
    ("o", 576, 576),
    ("gate_up", 576, 3072),
    ("down", 1536, 576),
    ("lm_head", 576, 49152),
)
#: --smoke: the first shape at one row, every weight format, a few runs.
SMOKE = {"shapes": ["qkv"], "m": [1], "repeats": 3}


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """Best wall time of ``fn`` over ``repeats`` runs after 3 warm-ups, in seconds."""
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def copy_bandwidth() -> float:
    """Bytes per second of a large tensor copy (read + write)."""
    src = torch.empty(256 * 2**20, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    seconds = best_time(lambda: dst.copy_(src), 5)
    return 2 * src.numel() / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", type=int, nargs="+", default=[1, 8, 32, 256])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None)
    names = [name for name, _, _ in SHAPES]
    parser.add_argument("--shapes", nargs="+", choices=names, default=names)
    parser.add_argument("--smoke", action="store_true", help="shape qkv, M = 1, 3 repeats")
    args = parser.parse_args()
    if args.smoke:  # the smallest sizes; flags given still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with torch.inference_mode():
        for name, k, n in (shape for shape in SHAPES if shape[0] in args.shapes):
            w = torch.randn(n, k) * 0.02
            weights: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], int, torch.dtype]]
            weights = {"f32": (lambda x, w=w: F.linear(x, w), w.nbytes, torch.float32)}
            wb = w.bfloat16()
            weights["bf16"] = (lambda x, wb=wb: F.linear(x, wb), wb.nbytes, torch.bfloat16)
            pk = prepack_dense(wb)
            if pk is not None:
                weights["bf16pk"] = (
                    lambda x, pk=pk: onednn_linear(x, pk, None),
                    wb.nbytes,
                    wb.dtype,
                )
            for scheme in ("int8", "int4"):
                packed = QuantizedWeight.from_group(quantize_rtn(w, scheme), scheme, torch.bfloat16)
                weights[scheme] = (packed.matmul, packed.nbytes, torch.bfloat16)
            for m in args.m:
                x = torch.randn(m, k)
                times = {}
                for fmt, (f, _, dt) in weights.items():
                    xd = x.to(dt)
                    times[fmt] = best_time(lambda f=f, xd=xd: f(xd), args.repeats)
                us = " ".join(f"{fmt}_us={t * 1e6:.1f}" for fmt, t in times.items())
                gbs = " ".join(
                    f"{fmt}_GBs={weights[fmt][1] / t / 1e9:.1f}" for fmt, t in times.items()
                )
                best = min(times, key=times.__getitem__)
                print(f"linear shape={name} K={k} N={n} M={m} {us} {gbs} best={best}", flush=True)
    print(
        f"linear copy_bandwidth_GBs={copy_bandwidth() / 1e9:.1f} threads={torch.get_num_threads()}"
    )


if __name__ == "__main__":
    main()
