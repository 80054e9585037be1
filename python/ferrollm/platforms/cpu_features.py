"""What this CPU can run, decided once per process and logged once.

The Rust core detects the features from the CPU itself (``ferrollm._core.cpu_features``, the
same value its attention and sampling kernels dispatch on), never from the build machine, and
the ``FERROLLM_CPU_ISA`` environment variable may cap them: ``avx2`` makes any x86-64 CPU
behave as an AVX2-only one (AMD Zen 2/3, most desktops), ``baseline`` as one without AVX2.
Every torch path that depends on a CPU feature asks `cpu_caps()` here, so a test or a CI job
can run an AVX-512 machine down the paths an AVX2 machine takes. (torch's own kernels follow
``ATEN_CPU_CAPABILITY`` and oneDNN's ``ONEDNN_MAX_CPU_ISA``; ``make test-avx2`` sets all three.)
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from ferrollm import _core

logger = logging.getLogger(__name__)

#: The environment variable that caps the features (read by the Rust core).
ISA_ENV = "FERROLLM_CPU_ISA"
#: bfloat16 arithmetic units: x86 AVX512-BF16 / AMX-BF16, Arm FEAT_BF16.
BF16_UNIT_FEATURES = ("avx512_bf16", "amx_bf16", "bf16")
#: What oneDNN's bfloat16 kernels need, any one group of them (torch checks the same before
#: ``mkldnn._reorder_linear_weight``, and raises "bf16 path needs the cpu support ..."
#: without): AVX512-BW/VL/DQ, or AVX-NE-CONVERT, or Arm's BF16.
ONEDNN_BF16_FEATURES = (("avx512bw", "avx512vl", "avx512dq"), ("avx_ne_convert",), ("bf16",))


@dataclass(frozen=True)
class CpuCaps:
    """The CPU's usable features (after the cap) and what follows from them."""

    #: The CPU's model name ("" where the OS does not say).
    model: str
    #: The ``FERROLLM_CPU_ISA`` cap in force: "native", "avx2" or "baseline".
    cap: str
    #: The features present and allowed, as ``/proc/cpuinfo`` names them.
    names: frozenset[str]
    #: The SIMD tier of the Rust kernels: "avx512", "avx2" or "generic".
    kernel_tier: str
    #: The block matmuls' code path (``ferrollm.layers.ggml_linear``): "avx512_vnni",
    #: "avx_vnni", "avx2" or "generic".
    block_path: str = "generic"

    @property
    def bf16_units(self) -> bool:
        """Whether the CPU has bfloat16 arithmetic (a bfloat16 model may then be fast)."""
        return any(name in self.names for name in BF16_UNIT_FEATURES)

    @property
    def onednn_bf16(self) -> bool:
        """Whether oneDNN's bfloat16 kernels (the packed-weight ``linear``) run here."""
        return any(all(n in self.names for n in group) for group in ONEDNN_BF16_FEATURES)

    def missing_for_onednn_bf16(self) -> str:
        """The features oneDNN's bfloat16 path needs, for messages ("" when present)."""
        if self.onednn_bf16:
            return ""
        return " or ".join("+".join(group) for group in ONEDNN_BF16_FEATURES)

    def describe(self) -> str:
        """One line for the start-up log."""
        capped = f" (capped by {ISA_ENV}={self.cap})" if self.cap != "native" else ""
        return (
            f"cpu: {self.model or 'unknown model'}{capped}: "
            f"{' '.join(sorted(self.names)) or 'no SIMD extensions'}; "
            f"kernels {self.kernel_tier}, "
            f"quantized matmuls {self.block_path} (int8 dot products), "
            f"bfloat16 units {'yes' if self.bf16_units else 'no'}, "
            f"oneDNN bfloat16 {'yes' if self.onednn_bf16 else 'no'}"
        )


@functools.cache
def cpu_caps() -> CpuCaps:
    """This process's `CpuCaps`, detected and logged on first use.

    Raises ValueError naming ``FERROLLM_CPU_ISA`` when it holds an unknown cap.
    """
    features = _core.cpu_features()
    caps = CpuCaps(
        model=cpu_model_name(),
        cap=features.cap,
        names=frozenset(features.names),
        kernel_tier=features.kernel_tier,
        block_path=_core.ggml_kernel_paths()[-1],
    )
    logger.info("%s", caps.describe())
    return caps


def cpu_model_name() -> str:
    """The ``model name`` line of ``/proc/cpuinfo`` ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return ""
