"""The host process after a model has loaded: one OpenMP team, and the loader's heap handed back.

`settle_after_load()` runs once, on the thread that loaded, when the engine is built:

* **One OpenMP team.** torch's CPU kernels run their parallel regions on an OpenMP team, and the
  OpenMP runtime keeps one pool of worker threads per thread that ever started a region. A
  server loads the model (and probes bf16 speed) on one thread and steps the engine on another,
  so the process ended up with two pools: four OpenMP threads on a 2-core machine. libgomp then
  throttles its workers' spin-waiting (more managed threads than CPUs), so every parallel region
  of the engine thread paid a futex wake-up. Measured here (2 cores, ``a + a`` on 64x576
  float32): 3.5 us on the first thread's team, 16-27 us on a second thread's team while the
  first pool lives; a bf16 decode step of the default model: 13 ms on the loading thread,
  19.5 ms on another one. `release_thread_pool` frees the calling thread's pool (OpenMP 5.0's
  ``omp_pause_resource_all``); if that thread computes again, the runtime rebuilds it.
* **The loader's heap back to the OS.** Loading converts tensor after tensor (a GGUF block
  decode, a pack for the quantized kernels); glibc keeps the freed memory as its high-water
  mark, about 100 MB for the default model, that the steps never need. `trim_heap` returns it
  (``malloc_trim``).

Both are no-ops where the runtime is not glibc/libgomp-like (they report False).

`share_openmp_with_kernels()` hands the same OpenMP runtime to the Rust kernels (the block
matmuls), so their parallel jobs run on the team torch's ops just used instead of on rayon's
pool, whose threads would wait for the spinning OpenMP workers to yield the cores.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import sys

logger = logging.getLogger("ferrollm.platforms")

#: Shared objects of the OpenMP runtimes torch wheels ship or link (GNU, LLVM, Intel).
_RUNTIME_NAMES = ("libgomp", "libomp", "libiomp5")
#: ``omp_pause_soft``: free the runtime's threads, keep what a later region can rebuild.
_OMP_PAUSE_SOFT = 1


def settle_after_load() -> None:
    """Call on the loading thread once the model is in place (see the module docstring)."""
    released = release_thread_pool()
    trimmed = trim_heap()
    logger.debug("after load: OpenMP pool released %s, heap trimmed %s", released, trimmed)


@functools.cache
def _openmp_runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime loaded in this process (by torch), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if ".so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        if path.rsplit("/", 1)[-1].startswith(_RUNTIME_NAMES):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            if hasattr(lib, "omp_pause_resource_all"):
                return lib
    return None


@functools.cache
def share_openmp_with_kernels() -> bool:
    """Run the Rust kernels' parallel jobs on the calling thread's OpenMP team from now on;
    True if the runtime torch loaded exports ``GOMP_parallel`` (libgomp; LLVM's and Intel's
    runtimes export it too), else they stay on rayon's pool."""
    import torch  # noqa: F401 (loads the runtime this looks for)

    from ferrollm import _core

    lib = _openmp_runtime()
    if lib is None or not hasattr(lib, "GOMP_parallel") or lib._name is None:
        logger.info("kernels' threads: rayon (no OpenMP runtime with GOMP_parallel loaded)")
        return False
    return _core._use_openmp(lib._name)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP worker threads; True if the runtime did."""
    import torch  # noqa: F401 (loads the runtime this looks for)

    lib = _openmp_runtime()
    return lib is not None and lib.omp_pause_resource_all(_OMP_PAUSE_SOFT) == 0


def trim_heap() -> bool:
    """Return the C heap's free pages to the OS (glibc ``malloc_trim``); True if any were."""
    libc = _libc()
    return libc is not None and hasattr(libc, "malloc_trim") and libc.malloc_trim(0) == 1
