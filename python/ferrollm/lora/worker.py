"""A tensor-parallel worker's adapters: the same slots as rank 0's, filled from the adapters'
directories when rank 0 says (``ferrollm.distributed.protocol``'s ``LORA_SLOT``), each rank
keeping its share of A and B (``ferrollm.lora.layers``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ferrollm.lora.adapter import load_peft_adapter

if TYPE_CHECKING:
    from torch import nn

    from ferrollm.config import EngineConfig
    from ferrollm.lora.layers import LoRAState


@dataclass(frozen=True)
class WorkerAdapters:
    """A worker's model and its adapter slots."""

    model: nn.Module
    state: LoRAState
    max_lora_rank: int

    @classmethod
    def of(
        cls, model: object, state: LoRAState | None, config: EngineConfig
    ) -> WorkerAdapters | None:
        """The worker's ``model`` (a loaded `CausalLM` module) with the slots ``state`` its
        build attached (``ferrollm.engine.build``), or None without them."""
        if state is None:
            return None
        module: nn.Module = model  # type: ignore[assignment]  # a CausalLM is a module
        return cls(module, state, config.max_lora_rank)

    def load_slot(self, slot: int, name: str, path: str) -> None:
        """Read adapter ``name`` from ``path`` into ``slot`` (rank 0 already checked it)."""
        adapter = load_peft_adapter(name, Path(path), self.model, self.max_lora_rank)
        self.state.load_slot(slot, adapter)
