"""`LoRAManager` on its own, with stand-in adapters and slots: what it does under its lock and
what a step without adapter rows costs."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from ferrollm.lora.manager import LoRAManager


class _Slots:
    """A `LoRAState` stand-in that records what the manager asks of it."""

    max_loras = 2
    max_lora_rank = 16

    def __init__(self) -> None:
        self.calls: list[str] = []

    def set_token_slots(self, slots: torch.Tensor) -> None:
        self.calls.append(f"slots {slots.tolist()}")

    def set_base_only(self) -> None:
        self.calls.append("base only")

    def load_slot(self, slot: int, adapter: Any) -> None:
        self.calls.append(f"load {adapter.name} into {slot}")


def _adapter(name: str, *_: object) -> Any:
    return SimpleNamespace(name=name, rank=8)


def test_reading_a_dropped_adapter_again_does_not_hold_the_lock(tmp_path: Path) -> None:
    started, release = threading.Event(), threading.Event()
    reads: list[str] = []

    def slow_loader(name: str, *_: object) -> Any:
        reads.append(name)
        if len(reads) > 2:  # the third read: "a" again, after it was dropped
            started.set()
            assert release.wait(10)
        return _adapter(name)

    slots = _Slots()
    manager = LoRAManager(torch.nn.Linear(1, 1), slots, max_cpu_loras=1, loader=slow_loader)  # type: ignore[arg-type]
    manager.add("a", tmp_path)
    manager.add("b", tmp_path)  # holds one idle adapter: "a" is dropped
    assert manager._names["a"].adapter is None
    bound: list[int] = []
    binder = threading.Thread(target=lambda: bound.append(manager.bind(7, "a")))
    binder.start()
    assert started.wait(10)
    # While "a" is being read, the manager's lock is free: other threads are answered.
    free = manager._lock.acquire(timeout=5)
    if free:
        manager._lock.release()
    release.set()
    binder.join(10)
    assert free, "bind read the adapter under the manager's lock"
    assert manager.names() == ["a", "b"]
    assert bound == [manager._names["a"].lora_id]
    assert manager._names["a"].adapter is not None and manager._names["a"].users == 1


def test_a_step_without_adapter_rows_only_marks_the_slots_unread(tmp_path: Path) -> None:
    slots = _Slots()
    manager = LoRAManager(torch.nn.Linear(1, 1), slots, max_cpu_loras=2, loader=_adapter)  # type: ignore[arg-type]
    lora_id = manager.add("a", tmp_path)
    manager.bind(1, "a")
    cu = np.array([0, 2, 3], dtype=np.int32)
    manager.prepare(np.array([0, 0], dtype=np.uint32), cu)
    assert slots.calls == ["base only"]
    manager.prepare(np.array([0, lora_id], dtype=np.uint32), cu)
    assert slots.calls[1:] == ["load a into 0", "slots [-1, -1, 0]"]
