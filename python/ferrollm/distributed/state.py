"""This process's place in a tensor-parallel group, passed to everything that shards."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.distributed


@dataclass(frozen=True)
class ParallelState:
    """This process's place in a tensor-parallel group."""

    rank: int = 0
    world_size: int = 1
    group: torch.distributed.ProcessGroup | None = None  # None when world_size == 1

    @property
    def is_driver(self) -> bool:
        """Rank 0: the process that owns the scheduler and samples."""
        return self.rank == 0


#: One process, no group: the unsharded model.
SINGLE = ParallelState()
