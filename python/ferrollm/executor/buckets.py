"""The row counts a graph-run decode step is padded up to, shared by the CPU's compiled decode
(``ferrollm.executor.compiled_decode``) and the CUDA graphs (``ferrollm.platforms.cuda_graphs``).
"""

from __future__ import annotations

#: Row counts a decode step is padded up to.
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def bucket_for(rows: int) -> int | None:
    """The smallest bucket holding ``rows`` rows, or None when none does."""
    return next((b for b in BUCKETS if b >= rows), None)
