"""A program that forks: the forked process is no worker.

``os.fork()`` inside a program copies the worker whole: the turn's context, its
open log, the pipe to the supervisor and the event loop. A child that went on
into the worker's code (it returned from the program, or used ``ctx``) wrote
the turn's closing records a second time, in the same epoch, and answered the
supervisor on the shared pipe ahead of the real worker, whose next turns then
failed ("no running event loop"). So a forked child is told apart from its
worker (a flag set after every fork, cleared where a worker starts) and kept
out: ``ctx`` refuses it (``TURN_GONE``), and it exits, at once and without
writing, when it returns from or raises out of the program. A child that
execs or exits by itself (``subprocess``, ``multiprocessing``) never meets
either rule.
"""

from __future__ import annotations

import os
import sys

__all__ = ["forked", "worker_started", "exit_forked"]

_forked = False


def _mark() -> None:
    global _forked
    _forked = True


os.register_at_fork(after_in_child=_mark)


def worker_started() -> None:
    """This process is a worker (it may itself have been forked from the supervisor or a fork server)."""
    global _forked
    _forked = False


def forked() -> bool:
    """Whether this process was forked from a worker by its program (a global read: called on every ``ctx`` use)."""
    return _forked


def exit_forked(failed: bool) -> None:
    """End a forked child that came back into the worker's code, before it writes anything; no-op in a worker."""
    if not _forked:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()  # what the child printed; ``os._exit`` flushes nothing
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(1 if failed else 0)
