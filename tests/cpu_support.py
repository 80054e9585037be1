"""The host CPU in tests: the torch paths ask ``ferrollm.platforms.cpu_features.cpu_caps()``
which path to take, so `fake_cpu` (patching it) runs any machine down another CPU's path."""

from __future__ import annotations

import pytest

from ferrollm.platforms import cpu_features
from ferrollm.platforms.cpu_features import CpuCaps


def fake_cpu(monkeypatch: pytest.MonkeyPatch, *names: str) -> CpuCaps:
    """Make this test's CPU one with exactly the features ``names``."""
    has = set(names).__contains__
    tier = "avx512" if has("avx512f") else "avx2" if has("avx2") else "generic"
    caps = CpuCaps(model="fake CPU", cap="native", names=frozenset(names), kernel_tier=tier)
    monkeypatch.setattr(cpu_features, "cpu_caps", lambda: caps)
    return caps


#: What a CPU without AVX-512 typically has (AMD Zen 2/3): the features of the AVX2 paths.
AVX2_ONLY = ("avx2", "fma", "f16c")
