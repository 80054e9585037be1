"""The CPU platform: the paged-attention kernel reading KV blocks in place; memory is the host's.

The compute dtype "auto" is bfloat16 when the CPU really has bfloat16 units and float32
otherwise (`has_fast_bfloat16`): the units come from `cpu_caps` (detected once, capped by
``FERROLLM_CPU_ISA``), but flags alone are not trusted (a CPU may advertise AMX that a library
cannot use), so a short matmul is timed once at start-up in both dtypes.
"""

from __future__ import annotations

import functools
import logging
import os
import time

import torch

from ferrollm.layers.attention import AttentionBackend
from ferrollm.layers.paged_attention import PagedKernelBackend
from ferrollm.platforms import cpu_features
from ferrollm.platforms.base import MemoryInfo, Platform

logger = logging.getLogger(__name__)

#: bfloat16 must beat float32 by this factor in the start-up probe to be chosen.
BF16_MIN_SPEEDUP = 1.3


class CpuPlatform(Platform):
    """Runs everything on the host CPU."""

    name = "cpu"
    dist_backend = "gloo"
    is_accelerator = False
    # Measured on the default model (numbers in ferrollm.executor.sizing.resolve_dtype): on CPUs
    # without bfloat16 units float32 is faster at batch 8 and up; `auto_dtype` picks bfloat16
    # only where the CPU has them and they measure faster.
    preferred_dtype = torch.float32

    def auto_dtype(self) -> torch.dtype:
        """bfloat16 where `has_fast_bfloat16`, else float32."""
        return torch.bfloat16 if has_fast_bfloat16() else torch.float32

    @classmethod
    def available(cls) -> bool:
        """Always: the host CPU is there."""
        return True

    def check_dtype(self, dtype: torch.dtype, field: str) -> None:
        """Every dtype runs on every CPU (torch converts where the CPU lacks the units); logs
        the CPU's features once, and warns when the model's ``dtype`` is bfloat16 without
        bfloat16 units (the KV cache's is read by the Rust kernel, which converts cheaply)."""
        caps = cpu_features.cpu_caps()
        if field == "dtype" and dtype == torch.bfloat16 and not caps.bf16_units:
            logger.warning(
                "`dtype` bfloat16 on a CPU without bfloat16 units (no %s): it runs on torch's "
                "converting kernels%s, slower than float32 from batches of about 8 rows "
                "(see ferrollm.executor.sizing.resolve_dtype)",
                "/".join(cpu_features.BF16_UNIT_FEATURES),
                "" if caps.onednn_bf16 else " without oneDNN-packed weights",
            )

    def attention_backend(self) -> AttentionBackend:
        """The Rust paged-attention kernel (no per-step gather; see ``benches/attention.py``)."""
        return PagedKernelBackend()

    def synchronize(self) -> None:
        """CPU ops are synchronous: nothing to wait for."""

    def memory_info(self) -> MemoryInfo:
        """Host memory: ``MemAvailable`` and ``MemTotal`` (Linux), else sysconf's view."""
        meminfo = _read_meminfo()
        if "MemAvailable" in meminfo and "MemTotal" in meminfo:
            return MemoryInfo(free=meminfo["MemAvailable"], total=meminfo["MemTotal"])
        page = os.sysconf("SC_PAGE_SIZE")
        return MemoryInfo(
            free=os.sysconf("SC_AVPHYS_PAGES") * page, total=os.sysconf("SC_PHYS_PAGES") * page
        )


@functools.cache
def has_fast_bfloat16() -> bool:
    """Whether the CPU advertises bfloat16 units and a bfloat16 matmul beats float32 on it.

    Probed once per process (about 50 ms): ``linear`` at M=64, K=N=1024 in both dtypes, best
    of five. The result and the timings are logged.
    """
    if not cpu_features.cpu_caps().bf16_units:
        logger.info(
            "CPU has no bfloat16 units (no %s): computing in float32",
            "/".join(cpu_features.BF16_UNIT_FEATURES),
        )
        return False
    f32 = _time_linear(torch.float32)
    bf16 = _time_linear(torch.bfloat16)
    fast = f32 >= BF16_MIN_SPEEDUP * bf16
    logger.info(
        "CPU bfloat16 probe: linear %.3f ms in bfloat16, %.3f ms in float32: computing in %s",
        bf16 * 1e3,
        f32 * 1e3,
        "bfloat16" if fast else "float32",
    )
    return fast


def _time_linear(dtype: torch.dtype) -> float:
    x = torch.randn(64, 1024, dtype=dtype)
    w = torch.randn(1024, 1024, dtype=dtype)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(6):
            start = time.perf_counter()
            torch.nn.functional.linear(x, w)
            best = min(best, time.perf_counter() - start)
    return best


def _read_meminfo() -> dict[str, int]:
    """``/proc/meminfo`` in bytes, or empty where there is none (not Linux)."""
    values = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                fields = rest.split()
                if fields and fields[0].isdigit():
                    values[key] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    except OSError:
        return {}
    return values
