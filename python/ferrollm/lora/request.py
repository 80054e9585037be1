"""`LoRARequest`: which adapter an offline call runs on, in vLLM's shape (torch-free)."""

from __future__ import annotations

from typing import NamedTuple


class LoRARequest(NamedTuple):
    """An adapter for ``LLM.generate`` / ``LLM.chat``: ``lora_name`` names it, ``lora_path``
    is its PEFT directory (read the first time the name is used, or again when the path
    differs; None: the name must already be loaded, e.g. from ``lora_modules``).

    ``lora_int_id`` is vLLM's positional second field, so its scripts run unchanged; it must be
    a positive integer but does not pick the adapter here (the engine numbers adapters itself,
    by name)."""

    lora_name: str
    lora_int_id: int = 1
    lora_path: str | None = None

    def checked(self) -> LoRARequest:
        """Itself; ValueError naming the field that breaks its rule."""
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"`lora_name` must be a non-empty string; got {self.lora_name!r}")
        lora_id = self.lora_int_id
        if isinstance(lora_id, bool) or not isinstance(lora_id, int) or lora_id < 1:
            raise ValueError(f"`lora_int_id` must be a positive integer; got {lora_id!r}")
        if self.lora_path is not None and not isinstance(self.lora_path, str):
            raise ValueError(f"`lora_path` must be a path string; got {self.lora_path!r}")
        return self
