"""The host after loading: the loading thread gives its OpenMP workers up, the heap is trimmed.

A second thread team (the server steps the engine on another thread than the one that loaded
it) made every parallel region of a decode step pay a futex wake-up (a bf16 step of the default
model went from 13 to 19.5 ms). These tests watch the OpenMP worker threads themselves, counted
in ``/proc/self/task``, and the resident memory in ``/proc/self/status``, in a fresh interpreter
(the pytest process's own threads and heap would blur them).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="counts threads through /proc"
)

_PRELUDE = """
import json, os, sys, time
import torch
from ferrollm.platforms.host import release_thread_pool, trim_heap

torch.set_num_threads(2)

def threads():
    # Workers leave asynchronously after a release: wait for the count to settle.
    count, stable_since = len(os.listdir("/proc/self/task")), time.monotonic()
    while time.monotonic() - stable_since < 0.3:
        time.sleep(0.02)
        now = len(os.listdir("/proc/self/task"))
        if now != count:
            count, stable_since = now, time.monotonic()
    return count

def rss_mb():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) // 1024 for l in status if l.startswith("VmRSS"))

def parallel_region():
    a = torch.ones(1024, 1024)  # far above torch's grain size: runs on the whole team
    return float((a + a).sum())
"""


def _run(script: str) -> dict[str, int | bool]:
    done = subprocess.run(
        [sys.executable, "-c", _PRELUDE + script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, int | bool] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_release_frees_the_calling_threads_pool() -> None:
    counts = _run(
        """
before = threads()
parallel_region()
with_pool = threads()
released = release_thread_pool()
after = threads()
parallel_region()  # a later region still works: the runtime rebuilds the pool
again = threads()
print(json.dumps(dict(before=before, with_pool=with_pool, released=released, after=after,
                      again=again)))
"""
    )
    assert counts["released"] is True
    assert counts["with_pool"] == counts["before"] + 1  # one worker beside the caller
    assert counts["after"] == counts["before"]
    assert counts["again"] == counts["with_pool"]


def test_trim_heap_returns_freed_heap_pages() -> None:
    sizes = _run(
        """
import ctypes
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
before = rss_mb()
# 200 MB in 64 KiB chunks (under glibc's mmap threshold: they come from the heap), touched,
# then freed but for the last one, which pins the heap's top so free() cannot shrink it.
chunks = [libc.malloc(64 << 10) for _ in range(3200)]
for chunk in chunks:
    ctypes.memset(chunk, 1, 64 << 10)
for chunk in chunks[:-1]:
    libc.free(chunk)
freed = rss_mb()
trimmed = trim_heap()
print(json.dumps(dict(before=before, freed=freed, trimmed=trimmed, after=rss_mb())))
"""
    )
    assert sizes["freed"] - sizes["before"] > 150  # the freed chunks stayed resident
    assert sizes["trimmed"] is True
    assert sizes["after"] - sizes["before"] < 30


def test_building_an_engine_leaves_no_pool_on_the_loading_thread(
    tiny_model_factory: Callable[..., Path],
) -> None:
    model = tiny_model_factory("tied")
    counts = _run(
        f"""
from ferrollm.config import EngineConfig
from ferrollm.engine.engine import LLMEngine

parallel_region()  # this thread has a pool before it loads
engine = LLMEngine.from_config(
    EngineConfig(model={str(model)!r}, device="cpu", dtype="float32", kv_cache_memory=1 << 20)
)
loaded = threads()
release_thread_pool()  # frees nothing if loading already gave the pool up
print(json.dumps(dict(loaded=loaded, released_again=threads())))
"""
    )
    assert counts["released_again"] == counts["loaded"]
