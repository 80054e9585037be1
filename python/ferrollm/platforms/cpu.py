"""The CPU platform: the paged-attention kernel reading KV blocks in place; memory is the host's."""

from __future__ import annotations

import os

import torch

from ferrollm.layers.attention import AttentionBackend
from ferrollm.layers.paged_attention import PagedKernelBackend
from ferrollm.platforms.base import MemoryInfo, Platform


class CpuPlatform(Platform):
    """Runs everything on the host CPU."""

    name = "cpu"
    dist_backend = "gloo"
    is_accelerator = False
    # Measured on the default model (numbers in ferrollm.executor.sizing.resolve_dtype): on CPUs
    # without bfloat16 matrix units float32 is faster at batch 8 and up, and only float32 keeps
    # greedy parity with float32 references.
    preferred_dtype = torch.float32

    @classmethod
    def available(cls) -> bool:
        """Always: the host CPU is there."""
        return True

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
