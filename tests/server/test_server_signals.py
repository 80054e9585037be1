"""`on_termination`: the app learns of SIGTERM when it arrives, and whatever already handled
the signal (Granian, through the event loop) still does."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

from ferrollm.server.signals import on_termination


def test_the_callback_runs_and_the_loops_own_handler_still_does() -> None:
    seen: list[str] = []

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, lambda: (seen.append("granian"), done.set()))
        try:
            installed = on_termination(loop, lambda: seen.append("app"))
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(done.wait(), 10)
            await asyncio.sleep(0)  # the app's callback was scheduled with call_soon
            return installed
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    previous = signal.getsignal(signal.SIGINT)
    try:
        assert asyncio.run(main())
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sorted(seen) == ["app", "granian"]


def test_nothing_is_installed_off_the_main_thread_or_over_a_default_action() -> None:
    loop = asyncio.new_event_loop()
    try:
        results: list[bool] = []
        thread = threading.Thread(target=lambda: results.append(on_termination(loop, print)))
        thread.start()
        thread.join()
        assert results == [False]
        saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            for sig in saved:
                signal.signal(sig, signal.SIG_DFL)
            assert not on_termination(loop, print)  # the default action would be lost
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)
    finally:
        loop.close()
