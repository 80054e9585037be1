"""What the CPU's compiled decode (``ferrollm.executor.compiled_decode``) and the CUDA graphs
(``ferrollm.platforms.cuda_graphs``) share: the row counts a graph-run decode step is padded up
to, and what keeps a model's decode step out of any graph.
"""

from __future__ import annotations

#: Row counts a decode step is padded up to.
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def bucket_for(rows: int) -> int | None:
    """The smallest bucket holding ``rows`` rows, or None when none does."""
    return next((b for b in BUCKETS if b >= rows), None)


def graph_blocker(model: object) -> str | None:
    """Why ``model``'s decode step cannot run as one graph, compiled or captured, or None:
    a tensor-parallel shard (its forward holds collectives), or a mixture of experts (it slices
    its rows by per-expert counts read back each layer: data-dependent shapes)."""
    if getattr(getattr(model, "parallel", None), "world_size", 1) > 1:
        return "tensor parallelism (a shard's forward holds collectives)"
    if not getattr(model, "compilable", True):
        return "a mixture-of-experts model (data-dependent shapes)"
    return None
