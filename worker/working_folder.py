"""The working folder a worker started in, taken back when a program moved it and no turn is left.

The working folder is the process's: a program that changed it (``os.chdir``)
and returned left every later turn on its worker, another agent's whatever
its program, reading and writing its relative paths there. Turns resident
together share it (one that parks waiting on its children keeps it), so it is
taken back only when none is left. Both kinds of worker do this: a local
worker process (``worker/main.py``) and a Ray actor (``worker/ray_actor.py``),
whose folder is the one Ray started it in.
"""

from __future__ import annotations

import contextlib
import logging
import os

__all__ = ["working_folder", "back_home"]

log = logging.getLogger(__name__)


def working_folder() -> str | None:
    """The process's working folder now, or ``None`` when it was removed under it (nothing to go back to)."""
    try:
        return os.getcwd()
    except OSError:
        return None


def back_home(home: str | None) -> None:
    """Go back to ``home`` if a program moved the process elsewhere; called with no turn left in the worker.
    One ``getcwd`` per turn when nothing moved."""
    if home is None:
        return
    with contextlib.suppress(OSError):
        if os.getcwd() == home:
            return
    try:
        os.chdir(home)
    except OSError as exc:
        log.warning("a program left the worker in another working folder, and its own (%s) cannot be taken back: %s", home, exc)
        return
    log.warning("a program left the worker in another working folder; back to %s for the next turn", home)
