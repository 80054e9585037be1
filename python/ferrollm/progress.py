"""Progress of the long start-up steps (reading the weights, the media encoder, profiling and
allocating the KV cache, compiling decode steps), on stderr.

On a terminal a counted step is a tqdm bar and an uncounted one a line that its end rewrites
with the time it took. Anywhere else (a service's log, a pipe, CI) each step is plain log
lines of ``ferrollm.startup``: its start, a line per quarter of a counted step, and its end
with the seconds it took, so a slow start-up shows where it is without a bar's control
characters in the log.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

logger = logging.getLogger("ferrollm.startup")

#: A counted step's plain log: a line each time it passes another quarter.
_PLAIN_STEPS = 4


def _terminal(stream: TextIO | None) -> TextIO | None:
    stream = sys.stderr if stream is None else stream
    return stream if stream.isatty() else None


@contextmanager
def step(name: str, *, stream: TextIO | None = None) -> Iterator[None]:
    """One uncounted start-up step called ``name`` (e.g. "Compiling decode steps")."""
    terminal = _terminal(stream)
    start = time.perf_counter()
    if terminal is not None:
        terminal.write(f"{name}...")
        terminal.flush()
    else:
        logger.info("%s...", name)
    outcome = "failed after"
    try:
        yield
        outcome = "done in"
    finally:
        seconds = time.perf_counter() - start
        if terminal is not None:
            terminal.write(f"\r{name}: {outcome} {seconds:.1f} s\n")
            terminal.flush()
        else:
            logger.info("%s: %s %.1f s", name, outcome, seconds)


@contextmanager
def counted(
    total: int, name: str, unit: str, *, stream: TextIO | None = None
) -> Iterator[Callable[[], None]]:
    """A start-up step of ``total`` ``unit``s called ``name``; yields ``tick()``, to call once
    per unit."""
    terminal = _terminal(stream)
    if terminal is not None:
        from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

        bar = tqdm(total=total, desc=name, unit=unit, file=terminal)
        try:
            yield lambda: bar.update(1)
        finally:
            bar.close()
        return
    done = 0
    reported = 0
    start = time.perf_counter()
    logger.info("%s: %d %ss...", name, total, unit)

    def tick() -> None:
        nonlocal done, reported
        done += 1
        quarter = done * _PLAIN_STEPS // max(total, 1)
        if quarter > reported and done < total:
            reported = quarter
            logger.info("%s: %d/%d %ss", name, done, total, unit)

    try:
        yield tick
    finally:
        logger.info("%s: %d/%d %ss in %.1f s", name, done, total, unit, time.perf_counter() - start)
