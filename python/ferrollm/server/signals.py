"""Learning of SIGTERM/SIGINT when it arrives, not when Granian's lifespan shutdown runs.

Granian's worker turns the signal into "stop accepting, let the open connections finish, then
run the lifespan shutdown", and waits for those connections without a deadline of its own
(its main process kills the worker ``workers_kill_timeout`` seconds after the signal). The app
must therefore start its drain clock at the signal itself, so that streams still running at
``--drain-timeout`` end with their route's error event instead of being cut by the kill.

Granian listens through the event loop (``loop.add_signal_handler``), which leaves a no-op
Python-level handler in place and learns of the signal from the loop's wakeup fd. Replacing that
no-op with a handler that schedules our callback and then calls the previous one keeps
Granian's own handling as it was: the C-level handler writes the wakeup fd whatever the
Python-level handler is.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from types import FrameType

#: The signals Granian's worker stops on.
TERMINATION_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_termination(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> bool:
    """Run ``callback`` on ``loop`` when a termination signal arrives (once per signal), in
    addition to whatever already handles it. Only where a Python-level handler is already set
    (a server's; the default action would otherwise be lost) and from the main thread (the
    only one that may set handlers); whether it was installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    installed = False
    for sig in TERMINATION_SIGNALS:
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue
        signal.signal(sig, _chained(loop, callback, previous))
        installed = True
    return installed


def _chained(
    loop: asyncio.AbstractEventLoop,
    callback: Callable[[], None],
    previous: Callable[[int, FrameType | None], object],
) -> Callable[[int, FrameType | None], None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        if not loop.is_closed():
            loop.call_soon_threadsafe(callback)
        previous(signum, frame)

    return handler
