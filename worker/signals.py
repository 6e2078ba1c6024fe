"""The stop signals a worker survives, and gives back to the processes its program starts.

A terminal's Ctrl-C (and its hangup) goes to the whole foreground process group,
and a service manager stops a whole group (or cgroup) with SIGTERM: the supervisor
takes each and stops the turns (``aborted``); a worker that died of it would read
as a crash, its turn closed ``interrupted``. So a worker outlives SIGINT, SIGTERM
and SIGHUP, and ends when its supervisor says so or goes away (its pipe's end), or
by SIGKILL.

It catches them with a handler that does nothing rather than ignoring them
(``SIG_IGN``): an ignored signal stays ignored across ``fork`` and ``exec``, so
every process a program started ignored them too, a ``sleep`` ran on after
``terminate()`` and a ``multiprocessing`` pool's ``terminate`` waited for good.
A handled signal goes back to its default at ``exec``; a process the program
forks gets Python's defaults back here, as it forks.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

__all__ = ["survive_stop_signals"]

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _survive(signum: int, frame: FrameType | None) -> None:
    """The worker's handler of the stop signals: they are the supervisor's to act on."""


def survive_stop_signals() -> None:
    """Catch the stop signals with ``_survive``, and let them through the mask (a fork server's child
    inherits them blocked: ``supervisor/pool.py``)."""
    for signum in STOPS:
        signal.signal(signum, _survive)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)


def _defaults_in_child() -> None:
    """After a fork of a worker (its program's ``os.fork``, a ``multiprocessing`` fork): Python's own
    dispositions, a ``KeyboardInterrupt`` for SIGINT and the system's default for the others."""
    for signum in STOPS:
        if signal.getsignal(signum) is _survive:
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)


os.register_at_fork(after_in_child=_defaults_in_child)
