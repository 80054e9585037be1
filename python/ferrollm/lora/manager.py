"""`LoRAManager`: the engine's adapters by name and number, the ones held in memory, and the
device slots a step's rows read.

* **Numbers.** Each adapter added gets the next number from 1 (0 is the base model); a name
  added again, after a removal or with new weights, gets a new one. The scheduler salts the
  prefix cache with the number (same text, another adapter: no hit) and runs at most
  ``max_loras`` distinct numbers at once (``SchedulerConfig.max_loras``).
* **Requests pin their adapter** from `bind` (the engine's ``add_request``) to `unbind` (the
  request finished, failed or was aborted): they finish on the weights they started with,
  even when the name is removed or given new weights meanwhile.
* **Held in memory**: every adapter a request pins, plus at most ``max_cpu_loras`` that none
  does (least recently used dropped first). A dropped adapter that came from a directory is
  read from it again when next asked for; one that came as weights (TensorRT-LLM's
  ``lora_weights``) is gone, and asking for it by name is an error naming it.
* **Device slots**: ``max_loras`` of them (`ferrollm.lora.layers.LoRAState`). `prepare` loads
  the step's adapters into slots (an empty one, else the least recently used one the step
  does not read) and gives every token its row's slot. The scheduler's cap means a step never
  reads more adapters than there are slots.

`bind`, `add` and `remove` may be called from any thread (the server's); `prepare` runs on the
engine's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import torch

from ferrollm.lora.adapter import LoRAAdapter, LoRAError, load_peft_adapter

if TYPE_CHECKING:
    from torch import nn

    from ferrollm.config import EngineConfig
    from ferrollm.lora.layers import LoRAState

#: Reads a PEFT directory for the model: (name, path, model, max_lora_rank) -> adapter.
AdapterLoader = Callable[[str, Path, "nn.Module", int], LoRAAdapter]


class UnknownLoRAError(LoRAError):
    """A request named an adapter that is not loaded."""


@dataclass
class _Entry:
    lora_id: int
    name: str
    path: Path | None  # None: given as weights, not read again once dropped
    adapter: LoRAAdapter | None  # None: dropped from memory
    users: int = 0
    parent: str | None = None  # the base model it names (``lora_modules``' base_model_name)


class LoRAManager:
    """Adapters over one model's `LoRAState` (module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        state: LoRAState,
        *,
        max_cpu_loras: int,
        loader: AdapterLoader = load_peft_adapter,
        on_slot: Callable[[int, str, Path | None], None] | None = None,
    ) -> None:
        self.model = model
        #: Called with (slot, name, path) after an adapter fills a slot: a tensor-parallel
        #: group's workers fill theirs (``Driver.load_lora_slot``).
        self._on_slot = on_slot
        self.state = state
        self.max_cpu_loras = max_cpu_loras
        self._loader = loader
        self._lock = threading.Lock()
        self._next_id = 1
        #: name -> its current entry.
        self._names: dict[str, _Entry] = {}
        #: number -> entry, for every adapter a name or a request still refers to.
        self._ids: dict[int, _Entry] = {}
        #: Unpinned adapters in memory, least recently used first.
        self._idle: OrderedDict[int, None] = OrderedDict()
        #: request key -> the adapter number it pinned.
        self._requests: dict[int, int] = {}
        #: Device slot -> the number it holds; and the step each slot was last read.
        self._slot_ids: list[int | None] = [None] * state.max_loras
        self._slot_used = [0] * state.max_loras
        self._step = 0

    @property
    def max_lora_rank(self) -> int:
        """The largest rank an adapter may have."""
        return self.state.max_lora_rank

    def names(self) -> list[str]:
        """The loaded adapters' names, in the order they were added."""
        with self._lock:
            return sorted(self._names, key=lambda n: self._names[n].lora_id)

    def path(self, name: str) -> Path | None:
        """The directory adapter ``name`` was read from (None: given as weights)."""
        with self._lock:
            return self._names[name].path

    def parent(self, name: str) -> str | None:
        """The base model adapter ``name`` says it was trained on (None: not said)."""
        with self._lock:
            return self._names[name].parent

    def is_cached(self, name: str) -> bool:
        """Whether adapter ``name`` is loaded and its weights held (or readable again)."""
        with self._lock:
            entry = self._names.get(name)
            return entry is not None and (entry.adapter is not None or entry.path is not None)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._names

    def add(self, name: str, path: str | Path, parent: str | None = None) -> int:
        """Read the PEFT adapter at ``path`` as ``name`` (replacing an adapter of that name for
        requests that come later); its number. LoRAError, naming it, if it cannot run here.
        ``parent`` is the base model it names, for listings."""
        adapter = self._loader(name, Path(path), self.model, self.max_lora_rank)
        return self._put(name, Path(path), adapter, parent)

    def add_adapter(self, adapter: LoRAAdapter) -> int:
        """Hold ``adapter`` (built from weights) under its name; its number."""
        if adapter.rank > self.max_lora_rank:
            raise LoRAError(
                f"adapter `{adapter.name}` has rank {adapter.rank}, above `max_lora_rank` "
                f"{self.max_lora_rank}"
            )
        return self._put(adapter.name, None, adapter)

    def remove(self, name: str) -> bool:
        """Forget ``name`` (requests on it finish on it); False if it was not loaded."""
        with self._lock:
            entry = self._names.pop(name, None)
            if entry is None:
                return False
            self._forget_if_unused(entry)
            return True

    def bind(self, key: int, name: str) -> int:
        """Pin adapter ``name`` for request ``key``; its number. UnknownLoRAError if it is not
        loaded (or was given as weights and has been dropped)."""
        while True:
            with self._lock:
                entry = self._names.get(name)
                if entry is None:
                    raise UnknownLoRAError(f"LoRA adapter {name!r} is not loaded")
                if entry.adapter is not None:
                    entry.users += 1
                    self._idle.pop(entry.lora_id, None)
                    self._requests[key] = entry.lora_id
                    return entry.lora_id
                if entry.path is None:
                    raise UnknownLoRAError(f"LoRA adapter {name!r} is no longer cached")
                path = entry.path
            # Dropped from memory: read it again outside the lock (other requests and the
            # engine's steps go on meanwhile), then pin it unless the name changed hands.
            adapter = self._loader(name, path, self.model, self.max_lora_rank)
            with self._lock:
                if self._names.get(name) is entry and entry.adapter is None:
                    entry.adapter = adapter

    def unbind(self, key: int) -> None:
        """Request ``key`` ended: unpin its adapter (if it had one)."""
        with self._lock:
            lora_id = self._requests.pop(key, None)
            if lora_id is None:
                return
            entry = self._ids[lora_id]
            entry.users -= 1
            if entry.users == 0:
                self._forget_if_unused(entry)

    def prepare(
        self, lora_ids: npt.NDArray[np.uint32], cu_seqlens_q: npt.NDArray[np.int32]
    ) -> None:
        """Before a step's forward: its adapters in slots and each token's slot (rows as in the
        plan: ``lora_ids`` per row, ``cu_seqlens_q`` their token boundaries)."""
        self._step += 1
        if not lora_ids.any():  # the common step: every row on the base model
            self.state.set_base_only()
            return
        row_slots = np.full(len(lora_ids), -1, dtype=np.int64)
        wanted = [int(i) for i in np.unique(lora_ids) if i != 0]
        for lora_id in wanted:
            slot = self._slot_for(lora_id, wanted)
            row_slots[lora_ids == lora_id] = slot
            self._slot_used[slot] = self._step
        counts = np.diff(cu_seqlens_q)
        self.state.set_token_slots(torch.from_numpy(np.repeat(row_slots, counts)))

    def _slot_for(self, lora_id: int, wanted: list[int]) -> int:
        if lora_id in self._slot_ids:
            return self._slot_ids.index(lora_id)
        free = [s for s, held in enumerate(self._slot_ids) if held not in wanted]
        if not free:
            raise RuntimeError(
                f"a step reads {len(wanted)} LoRA adapters but there are "
                f"{len(self._slot_ids)} slots (the scheduler's max_loras must equal them)"
            )

        # An empty slot, lowest first (a step computes slots [0, highest read]), else the
        # least recently read.
        def victim(s: int) -> tuple[int, int]:
            return (0, s) if self._slot_ids[s] is None else (1, self._slot_used[s])

        slot = min(free, key=victim)
        with self._lock:
            adapter = self._ids[lora_id].adapter
        assert adapter is not None  # a running request pins it
        self._slot_ids[slot] = None  # until every rank holds it
        self.state.load_slot(slot, adapter)
        if self._on_slot is not None:
            with self._lock:
                path = self._ids[lora_id].path
            self._on_slot(slot, adapter.name, path)
        self._slot_ids[slot] = lora_id
        return slot

    def _put(
        self, name: str, path: Path | None, adapter: LoRAAdapter, parent: str | None = None
    ) -> int:
        with self._lock:
            old = self._names.pop(name, None)
            if old is not None:
                self._forget_if_unused(old)
            entry = _Entry(self._next_id, name, path, adapter, parent=parent)
            self._next_id += 1
            self._names[name] = entry
            self._ids[entry.lora_id] = entry
            self._idle[entry.lora_id] = None
            self._evict()
            return entry.lora_id

    def _forget_if_unused(self, entry: _Entry) -> None:
        """Under the lock: an entry no request pins is idle (while named) or gone."""
        if entry.users:
            return
        if self._names.get(entry.name) is entry:
            self._idle[entry.lora_id] = None
            self._idle.move_to_end(entry.lora_id)
            self._evict()
            return
        self._idle.pop(entry.lora_id, None)
        del self._ids[entry.lora_id]
        if entry.lora_id in self._slot_ids:  # never read again: free its slot
            self._slot_ids[self._slot_ids.index(entry.lora_id)] = None

    def _evict(self) -> None:
        """Under the lock: drop the least recently used idle adapters beyond the cap (one
        given as weights, with no directory to read it from again, is forgotten)."""
        held = [i for i in self._idle if self._ids[i].adapter is not None]
        for lora_id in held[: max(0, len(held) - self.max_cpu_loras)]:
            entry = self._ids[lora_id]
            entry.adapter = None
            if entry.path is None:
                del self._names[entry.name]
                self._forget_if_unused(entry)


def attach_engine_lora(model: nn.Module, config: EngineConfig) -> LoRAState:
    """``model``'s adapter slots as the engine's options size them (``max_loras`` of rank
    ``max_lora_rank``, per-step buffers of ``max_num_batched_tokens``); every rank of a
    tensor-parallel group attaches them alike."""
    from ferrollm.lora.layers import DEFAULT_MAX_NUM_TOKENS, attach_lora

    # float32 slots on a CPU: its small bfloat16 matmuls measured 2.5-3x slower than float32
    # at these shapes (benches/lora.py); accelerators keep the model's dtype.
    on_cpu = next(model.parameters()).device.type == "cpu"
    return attach_lora(
        model,
        config.max_loras,
        config.max_lora_rank,
        max_num_tokens=config.max_num_batched_tokens or DEFAULT_MAX_NUM_TOKENS,
        dtype=torch.float32 if on_cpu else None,
    )


def build_lora_manager(
    model: nn.Module,
    state: LoRAState,
    config: EngineConfig,
    on_slot: Callable[[int, str, Path | None], None] | None = None,
) -> LoRAManager:
    """The manager of ``model``'s adapter slots ``state`` (`attach_engine_lora`), with
    ``config.lora_modules`` loaded (LoRAError naming the first that cannot run); ``on_slot``
    as `LoRAManager` takes it."""
    max_cpu_loras = config.max_cpu_loras or config.max_loras
    manager = LoRAManager(model, state, max_cpu_loras=max_cpu_loras, on_slot=on_slot)
    for module in config.lora_modules:
        manager.add(module.name, module.path, module.base_model_name)
    return manager
