"""One OpenMP thread team per process: handing the CPU's cores over to the engine's thread.

torch's CPU kernels run their parallel regions on an OpenMP team, and the OpenMP runtime keeps
one pool of worker threads per thread that ever started a region. A server loads the model (and
probes bf16 speed) on its main thread, then steps the engine on a thread of its own, so the
process ends up with two pools: four OpenMP threads on a 2-core machine. libgomp then throttles
its workers' spin-waiting (more managed threads than CPUs), so every parallel region of the
engine thread pays a futex wake-up. Measured here (2 cores, torch 2.x, ``a + a`` on 64x576
float32): 3.5 us on the first thread's team, 16-27 us on a second thread's team while the first
pool lives; a bf16 decode step of the default model: 13 ms on the loading thread, 19.5 ms on
another one.

`release_thread_pool()` frees the calling thread's pool (OpenMP 5.0's
``omp_pause_resource_all``), which a thread that hands the compute to another calls once.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import sys

logger = logging.getLogger("ferrollm.platforms")

#: Shared objects of the OpenMP runtimes torch wheels ship or link (GNU, LLVM, Intel).
_RUNTIME_NAMES = ("libgomp", "libomp", "libiomp5")
#: ``omp_pause_soft``: free the runtime's threads, keep what a later region can rebuild.
_OMP_PAUSE_SOFT = 1


@functools.cache
def _runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime loaded in this process (by torch), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if ".so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        name = path.rsplit("/", 1)[-1]
        if name.startswith(_RUNTIME_NAMES):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            if hasattr(lib, "omp_pause_resource_all"):
                return lib
    return None


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP worker threads; True if the runtime did.

    A later parallel region on this thread rebuilds its pool (correct, just slower for the
    other team again), so call it from a thread that is done computing. A no-op returning
    False where no OpenMP runtime with ``omp_pause_resource_all`` is loaded.
    """
    import torch  # noqa: F401 (loads the runtime this looks for)

    lib = _runtime()
    if lib is None:
        logger.debug("no OpenMP runtime with omp_pause_resource_all loaded")
        return False
    released = bool(lib.omp_pause_resource_all(_OMP_PAUSE_SOFT) == 0)
    logger.debug("released this thread's OpenMP pool: %s", released)
    return released
