"""Ways to add a batch's LoRA deltas to a projection on the CPU, at SmolLM2-135M's shapes.

Every row carries an adapter slot (-1: the base model); the base product is computed once
for the batch, and this measures only the delta added after it, for ``S`` slots of rank
``R`` and ``T`` rows spread round-robin over the base and the slots:

* ``masked``: ``h = x @ A_all.T`` over every slot (``[T, S*R]`` per shard), the columns of the
  other slots zeroed per row, then ``out += h @ B.T`` per shard (``ferrollm.lora.layers``);
* ``masked_bd``: the same with one block-diagonal B for all shards (one matmul, zeros included);
* ``segmented``: rows sorted by slot, one pair of matmuls per active slot, ``index_add_``;
* ``gathered``: each row's A and B gathered (punica's bgmv), two batched matmuls.

One line per (shape, T): best-of-N microseconds of each, and of the base product itself:

  lora_layers shape=qkv T=8 dtype=float32 base_us=.. masked_us=.. masked_bd_us=..
              segmented_us=.. gathered_us=..

Usage: python benches/lora_layers.py [--t 1 8 32 256] [--slots 4] [--rank 16]
                                     [--dtype float32 bfloat16] [--repeats 50] [--smoke]
  --smoke   shape qkv, T = 8, 3 repeats: that the bench still runs (the test suite runs it)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

#: (name, in_features, output shards) of SmolLM2-135M's projections (9 heads x 64, 3 KV heads).
SHAPES = {
    "qkv": (576, (576, 192, 192)),
    "o": (576, (576,)),
    "gate_up": (576, (1536, 1536)),
    "down": (1536, (576,)),
}


def _variants(
    x: torch.Tensor, slots: torch.Tensor, in_f: int, outs: tuple[int, ...], s: int, r: int
) -> dict[str, Callable[[], torch.Tensor]]:
    dtype = x.dtype
    n = len(outs)
    a = torch.randn(n * s * r, in_f, dtype=dtype) * 0.05  # (shard, slot, rank) rows
    bs = [torch.randn(o, s * r, dtype=dtype) * 0.05 for o in outs]
    bd = torch.block_diag(*bs)
    col_slot = torch.arange(n * s * r) // r % s
    w = torch.randn(sum(outs), in_f, dtype=dtype) * 0.05
    a3 = a.view(n, s, r, in_f).transpose(0, 1).reshape(s, n * r, in_f)
    b3 = bd.view(sum(outs), n, s, r).permute(2, 0, 1, 3).reshape(s, sum(outs), n * r)
    # Built once per step for every layer of this width (`LoRAState.set_token_slots`).
    mask = (slots[:, None] == col_slot).to(dtype)

    def base() -> torch.Tensor:
        return F.linear(x, w)

    def masked() -> torch.Tensor:
        out = F.linear(x, w)
        h = F.linear(x, a).mul_(mask)
        start = 0
        for k, b in enumerate(bs):
            out[:, start : start + b.shape[0]].addmm_(h[:, k * s * r : (k + 1) * s * r], b.t())
            start += b.shape[0]
        return out

    def masked_bd() -> torch.Tensor:
        h = F.linear(x, a).mul_(mask)
        return torch.addmm(F.linear(x, w), h, bd.t())

    def segmented() -> torch.Tensor:
        out = F.linear(x, w)
        order = torch.argsort(slots)
        counts = torch.bincount(slots + 1, minlength=s + 1).tolist()
        start = counts[0]
        for slot in range(s):
            if counts[slot + 1] == 0:
                continue
            rows = order[start : start + counts[slot + 1]]
            start += counts[slot + 1]
            delta = F.linear(F.linear(x[rows], a3[slot]), b3[slot])
            out.index_add_(0, rows, delta)
        return out

    def gathered() -> torch.Tensor:
        out = F.linear(x, w)
        idx = slots.clamp(min=0)
        h = torch.bmm(a3[idx], x[:, :, None])  # [T, nR, 1]
        delta = torch.bmm(b3[idx], h)[:, :, 0] * (slots >= 0)[:, None]
        return out + delta

    return {
        "base": base,
        "masked": masked,
        "masked_bd": masked_bd,
        "segmented": segmented,
        "gathered": gathered,
    }


def _best_us(fn: Callable[[], torch.Tensor], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--t", type=int, nargs="+", default=[1, 8, 32, 256])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--dtype", nargs="+", default=["float32"])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.t, args.shapes, args.repeats = [8], ["qkv"], 3
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with torch.inference_mode():
        for dtype_name in args.dtype:
            dtype = getattr(torch, dtype_name)
            for shape in args.shapes:
                in_f, outs = SHAPES[shape]
                for t in args.t:
                    x = torch.randn(t, in_f, dtype=dtype)
                    slots = (torch.arange(t) + 1) % (
                        args.slots + 1
                    ) - 1  # row 0 on slot 0, then all
                    variants = _variants(x, slots, in_f, outs, args.slots, args.rank)
                    ref = variants["masked_bd"]().float()
                    times = []
                    for name, fn in variants.items():
                        if name != "base":
                            torch.testing.assert_close(fn().float(), ref, rtol=2e-2, atol=2e-2)
                        times.append(f"{name}_us={_best_us(fn, args.repeats):.1f}")
                    print(f"lora_layers shape={shape} T={t} dtype={dtype_name}", *times)
    print(f"lora_layers threads={torch.get_num_threads()}")


if __name__ == "__main__":
    main()
