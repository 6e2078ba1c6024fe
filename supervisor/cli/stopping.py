"""SIGTERM and SIGHUP stop a CLI host the way Ctrl-C does.

A service manager stops a host with SIGTERM, a closed terminal sends SIGHUP;
both killed the process at once by default, and the children it hosted were
left ``crashed`` for the next host to repair. While a verb runs, each is
handed to the process's SIGINT handler instead: under the event loop that
cancels the host's work, so its turns end ``aborted`` and their leases are
released; a second signal ends it at once, as a second Ctrl-C does. A
signal the process was started with ignored stays ignored (``nohup``). The
CLI's boundary then says which signal it was and exits 128 + its number, as
a shell reports a process the signal ended.

The workers ignore all three signals (``worker/main.py``): sent to the whole
process group they would otherwise die under turns their host is stopping.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Iterator

__all__ = ["StopSignals"]

_SAID = {signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}


class StopSignals:
    """Installed around one verb (``installed``); ``received`` is the first stop signal that came."""

    def __init__(self) -> None:
        self.received: int | None = None

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
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        interrupt = signal.getsignal(signal.SIGINT)
        if callable(interrupt):  # the event loop's (cancels the host's work) or the default (raises)
            interrupt(signal.SIGINT, frame)
            return
        # SIGINT is ignored here (a shell's background job), so the event loop took no handler for it:
        # this stops the host all the same, from wherever it is, without the orderly abort of its turns
        raise KeyboardInterrupt
