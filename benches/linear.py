"""Weight-only matmuls on the CPU at the default model's shapes: ferrollm's block kernels
against torch's int4/int8 kernels and dense bfloat16 / float32.

For each of SmolLM2-135M's projections (fused qkv, o, fused gate/up, down, the tied LM head)
and M = 1, 8, 32, 256 rows, one line per (shape, M) with the best-of-N time of each weight
format and the bandwidth it achieved reading its weight bytes, then this machine's copy
bandwidth (a 256 MiB ``copy_``, read + write bytes) and the kernel path in use:

  linear shape=qkv K=576 N=960 M=1 f32_us=.. bf16_us=.. int8_us=.. int4_us=.. q4_1_us=..
         q8_0_us=.. f32_GBs=.. ... best=q4_1
  linear copy_bandwidth_GBs=.. threads=2 path=avx512_vnni

``--shapes mlp`` (in the default list) times the whole gated feed-forward on q4_1 blocks, the
fused call (``GgmlWeight.silu_mlp``, ``ferrollm.layers.gated_mlp``) against gate/up, SiLU,
multiply and down as separate calls:

  linear shape=mlp K=576 N=1536 M=1 fused_us=.. unfused_us=.. speedup=..

``q4_1``/``q5_0``/``q8_0``/``q4_k``/``q6_k`` are ferrollm's kernels
(``ferrollm.layers.ggml_linear``) on the weight quantized to that GGUF type (K-quants only
where K is a multiple of 256), with float32 activations (what an AVX2-only CPU runs; bfloat16
ones cost the same). int4 is torch's
``aten._weight_int4pack_mm_for_cpu`` (group 32), int8 ``aten._weight_int8pack_mm`` (per-channel
scales), both with bfloat16 activations (they are 10-25x slower with float32 ones). float32 and
bfloat16 are ``F.linear``; bf16pk is the bfloat16 weight reordered for oneDNN
(``ferrollm.layers.linear.prepack_dense``) where this CPU runs oneDNN's bfloat16 kernels.
``FERROLLM_CPU_ISA=avx2`` (with ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` for
torch) measures an AVX2-only CPU's paths.

Usage: python benches/linear.py [--m 1 8 32 256] [--shapes qkv o ...] [--repeats 50]
                                 [--formats f32 bf16 ...] [--threads N] [--smoke]
  --smoke   shapes qkv and mlp, M = 1, 3 repeats: that the bench still runs (the test suite runs it)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import gguf
import numpy as np
import torch
import torch.nn.functional as F
from gguf import quants

from ferrollm.layers.ggml_linear import GgmlBlocks, GgmlWeight, kernel_paths
from ferrollm.layers.linear import onednn_linear, prepack_dense

#: (name, K = in features, N = out features) of SmolLM2-135M's matmuls.
SHAPES = (
    ("qkv", 576, 960),
    ("o", 576, 576),
    ("gate_up", 576, 3072),
    ("down", 1536, 576),
    ("lm_head", 576, 49152),
)
FORMATS = ("f32", "bf16", "bf16pk", "int8", "int4", "q4_1", "q5_0", "q8_0", "q4_k", "q6_k")
#: --smoke: the first shape at one row, every weight format, a few runs.
SMOKE = {"shapes": ["qkv", "mlp"], "m": [1], "repeats": 3}

Matmul = Callable[[torch.Tensor], torch.Tensor]


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


def torch_int8(w: torch.Tensor) -> tuple[Matmul, int]:
    """``w`` per-channel int8 on ``aten._weight_int8pack_mm`` (bfloat16 activations)."""
    scale = (w.abs().amax(-1) / 127).clamp(min=1e-12)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    scales = scale.bfloat16()
    return (lambda x: torch.ops.aten._weight_int8pack_mm(x, q, scales)), q.numel() + 2 * len(scale)


def torch_int4(w: torch.Tensor) -> tuple[Matmul, int]:
    """``w`` min/max int4 in groups of 32 on ``aten._weight_int4pack_mm_for_cpu``."""
    n, k = w.shape
    blocks = w.view(n, k // 32, 32)
    lo, hi = blocks.amin(-1), blocks.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    q = torch.round((blocks - lo[..., None]) / scale[..., None]).clamp(0, 15).view(n, k)
    # The kernel computes (q - 8) * scale + zero.
    sz = torch.stack([scale.t(), (lo + 8 * scale).t()], dim=-1).bfloat16().contiguous()
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    fn = lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, sz)  # noqa: E731
    return fn, packed.numel() * packed.element_size() + sz.numel() * 2


def ggml(w: torch.Tensor, kind: str) -> tuple[Matmul, int] | None:
    """``w`` quantized by gguf into ``kind`` blocks, on ferrollm's kernels (None: K is not
    whole blocks of it). K-quants, which gguf-py cannot quantize, get random blocks of the
    same size (the kernels' speed does not depend on the values)."""
    qtype = gguf.GGMLQuantizationType[kind.upper()]
    values, size = gguf.GGML_QUANT_SIZES[qtype]
    n, k = w.shape
    if k % values:
        return None
    if kind.endswith("_k"):
        raw = np.random.default_rng(0).integers(0, 256, (n, k // values, size), dtype=np.uint8)
        scale = np.full(2, 0.01, np.float16).view(np.uint8)
        raw[..., :4], raw[..., -2:] = scale, scale[:2]  # Q4_K's d, dmin; Q6_K's d
        raw = raw.reshape(n, -1)
    else:
        raw = np.asarray(quants.quantize(w.numpy(), qtype))
    weight = GgmlWeight([GgmlBlocks(torch.from_numpy(raw), int(qtype), k)])
    return weight.matmul, raw.nbytes


def mlp_line(m: int, repeats: int) -> str:
    """The default model's feed-forward (hidden 576, intermediate 1536) on q4_1 blocks at ``m``
    rows: the fused call against its parts."""
    hidden, inner = 576, 1536

    def blocks(w: torch.Tensor) -> GgmlWeight:
        raw = np.asarray(quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q4_1))
        return GgmlWeight(
            [GgmlBlocks(torch.from_numpy(raw), int(gguf.GGMLQuantizationType.Q4_1), w.shape[1])]
        )

    gate_up = blocks(torch.randn(2 * inner, hidden) * 0.02)
    down = blocks(torch.randn(hidden, inner) * 0.02)
    x = torch.randn(m, hidden)

    def unfused() -> torch.Tensor:
        gate, up = gate_up.matmul(x).chunk(2, dim=-1)
        return down.matmul(F.silu(gate) * up)

    fused = best_time(lambda: gate_up.silu_mlp(x, down), repeats)
    parts = best_time(unfused, repeats)
    return (
        f"linear shape=mlp K={hidden} N={inner} M={m} fused_us={fused * 1e6:.1f} "
        f"unfused_us={parts * 1e6:.1f} speedup={parts / fused:.2f}"
    )


def formats(w: torch.Tensor, wanted: list[str]) -> dict[str, tuple[Matmul, int, torch.dtype]]:
    """Each weight format of ``w`` asked for and available: (matmul, weight bytes, x dtype)."""
    out: dict[str, tuple[Matmul, int, torch.dtype]] = {}
    wb = w.bfloat16()
    for fmt in wanted:
        if fmt == "f32":
            out[fmt] = (lambda x: F.linear(x, w), w.nbytes, torch.float32)
        elif fmt == "bf16":
            out[fmt] = (lambda x: F.linear(x, wb), wb.nbytes, torch.bfloat16)
        elif fmt == "bf16pk" and (pk := prepack_dense(wb)) is not None:
            out[fmt] = (lambda x, pk=pk: onednn_linear(x, pk, None), wb.nbytes, torch.bfloat16)
        elif fmt in ("int8", "int4"):
            fn, size = (torch_int8 if fmt == "int8" else torch_int4)(w)
            out[fmt] = (fn, size, torch.bfloat16)
        elif fmt.startswith("q") and (kernel := ggml(w, fmt)) is not None:
            out[fmt] = (*kernel, torch.float32)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", type=int, nargs="+", default=[1, 8, 32, 256])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None)
    names = [name for name, _, _ in SHAPES]
    parser.add_argument("--shapes", nargs="+", choices=[*names, "mlp"], default=[*names, "mlp"])
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
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
            weights = formats(torch.randn(n, k) * 0.02, args.formats)
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
        if "mlp" in args.shapes:
            for m in args.m:
                print(mlp_line(m, args.repeats), flush=True)
    print(
        f"linear copy_bandwidth_GBs={copy_bandwidth() / 1e9:.1f} threads={torch.get_num_threads()}"
        f" path={kernel_paths()[-1]}"
    )


if __name__ == "__main__":
    main()
