"""SIGTERM and SIGHUP stop a CLI host the way Ctrl-C does.

A service manager stops a host with SIGTERM, a closed terminal sends SIGHUP;
both killed the process at once by default, and the children it hosted were
left ``crashed`` for the next host to repair. While a verb runs, each is
handed to the process's SIGINT handler instead: under the event loop that
cancels the host's work, so its turns end ``aborted`` and their leases are
released; a second signal ends it at once, as a second Ctrl-C does. A
process started with SIGINT ignored (a shell's background job) has no such
handler, and ``host`` then cancels the host's work itself. A
signal the process was started with ignored stays ignored (``nohup``). The
CLI's boundary then says which signal it was and exits 128 + its number, as
a shell reports a process the signal ended.

The workers ignore all three signals (``worker/main.py``): sent to the whole
process group they would otherwise die under turns their host is stopping.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Any, Awaitable, Callable, Iterator, TypeVar

__all__ = ["StopSignals"]

_SAID = {signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}
EXIT_INTERRUPTED = 128 + signal.SIGINT

T = TypeVar("T")


class StopSignals:
    """Installed around one verb (``installed``); ``received`` is the first stop signal that came."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._stops = 0  # stop requests seen while a host ran (``host``): the second quits at once
        # set by ``host`` when SIGINT is ignored: cancels the host's work as the event loop's handler would
        self._cancel_host: Callable[[int, FrameType | None], None] | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_INTERRUPTED if self.received is None else 128 + self.received

    @property
    def said(self) -> str:
        """What the CLI prints for the signal received."""
        assert self.received is not None
        return _SAID[signal.Signals(self.received)]

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Forward SIGTERM and SIGHUP to the SIGINT handler while the block runs; the old handlers after.

        Only the main thread may install handlers (a CLI run from another thread, in a test, keeps its own).
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        # one the process was started with ignored stays ignored: ``nohup`` ignores SIGHUP so that the host
        # outlives its terminal
        previous = {signum: signal.signal(signum, self._forward) for signum in _SAID
                    if signal.getsignal(signum) is not signal.SIG_IGN}
        previous[signal.SIGINT] = signal.getsignal(signal.SIGINT)  # ``host`` may replace the event loop's
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        if self._cancel_host is not None:  # SIGINT ignored while a host runs: ``host`` stands in for the loop's handler
            self._cancel_host(signum, frame)
            return
        interrupt = signal.getsignal(signal.SIGINT)
        if callable(interrupt):  # the event loop's (cancels the host's work) or the default (raises)
            interrupt(signal.SIGINT, frame)
            return
        # SIGINT is ignored and no host runs (a verb that only reads): stop it from wherever it is
        raise KeyboardInterrupt

    def host(self, func: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``anyio.run(func, *args)`` for a verb that hosts turns: a second stop request quits at once.

        The first Ctrl-C (or stop signal) cancels the host's work, and its close waits for every turn
        to stop (a turn that ignores cancellation: ``cancel_grace_s``, then its worker is killed). A
        second one used to raise out of the event loop, whose own close then waited for the same
        tasks, cancelled mid-way: slower than the first (probe: 12.5 s against 2.2 s). Now it ends the
        process on the spot: its workers exit as their pipes close, and the turns they ran are
        repaired by the next host that resumes them (``crashed``), as after a ``kill -9``.

        The event loop is imported here, by the verbs that host turns: the views that only read a store
        never load it.
        """
        import asyncio

        import anyio

        async def hosted() -> T:
            interrupt = signal.getsignal(signal.SIGINT)
            if threading.current_thread() is threading.main_thread():
                if callable(interrupt):
                    signal.signal(signal.SIGINT, lambda signum, frame: self._stop(interrupt, signum, frame))
                else:
                    # SIGINT ignored (a shell's background job): the loop installed no handler, and a stop
                    # signal raising out of it left the turns to its teardown, which never told their
                    # workers (each was killed after the grace). Cancel the host's task, as that handler does.
                    task, loop = asyncio.current_task(), asyncio.get_running_loop()

                    def cancel(signum: int, frame: FrameType | None) -> None:
                        assert task is not None
                        task.cancel()
                        loop.call_soon_threadsafe(lambda: None)  # wakes a loop asleep in select()

                    self._cancel_host = lambda signum, frame: self._stop(cancel, signum, frame)
            return await func(*args)

        try:
            return anyio.run(hosted)
        except asyncio.CancelledError:
            if self._cancel_host is not None and self._stops:
                raise KeyboardInterrupt from None  # what the loop's own handler makes of its cancellation
            raise
        finally:
            self._cancel_host = None

    def _stop(self, interrupt: Callable[[int, FrameType | None], Any], signum: int, frame: FrameType | None) -> None:
        self._stops += 1
        if self._stops == 1:
            interrupt(signum, frame)  # the event loop's: cancels the host's work
            return
        said = "interrupted" if self.received is None else self.said
        sys.stderr.write(f"{said} again: quitting without waiting for the turns (the next host repairs them)\n")
        sys.stderr.flush()
        os._exit(self.exit_code)
