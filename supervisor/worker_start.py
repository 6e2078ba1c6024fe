"""What starting a worker needs of the host, looked at before it is asked for, and how a replacement waits.

A host shares its open-file and process limits with the application around it. Asking the
forkserver for a worker connects its socket first, then opens two pipes; a pipe that failed for
want of a descriptor closed the connected socket, the forkserver read an end of file where it
expected descriptors, printed multiprocess's ``EOFError`` traceback on the host's stderr and died.
``spare_descriptors`` looks first, so the want of descriptors fails that start alone
(``WORKER_START_FAILED``, saying which limit), the forkserver untouched.

A worker that dies is replaced. When the replacement cannot start (no descriptor, no process left
under ``ulimit -u``, a worker that exits before it is ready), the pool tries again after
``replacement_delays``, rather than let the error end the supervisor (it used to leave the pool's
watch task and take the supervisor's task group down); meanwhile a turn queued while no worker is
alive ends ``error`` saying why, rather than wait for a worker that may never come.

A worker is launched with the host's main script hidden (``main_module_hidden``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from typing import Iterator

__all__ = ["FORKSERVER_DESCRIPTORS", "main_module_hidden", "spare_descriptors", "replacement_delays"]

# what asking the forkserver for a worker holds at once: its socket and two pipes (multiprocess's
# ``connect_to_new_process``), then the two ends it keeps and a ``dup``
FORKSERVER_DESCRIPTORS = 6
# the waits between two tries of a replacement: short at first (a limit reached for a moment), then
# a few seconds (a limit that stays: one error line per try in the log, not a busy loop)
FIRST_DELAY_S = 0.1
MAX_DELAY_S = 5.0


def spare_descriptors(count: int) -> None:
    """Raise ``OSError`` (``EMFILE``, ``ENFILE``) unless ``count`` descriptors can be opened now."""
    held: list[int] = []
    try:
        for _ in range(count):
            held.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    finally:
        for fd in held:
            os.close(fd)


def replacement_delays() -> Iterator[float]:
    """The waits before each next try of a replacement that failed: doubling, then ``MAX_DELAY_S`` for good."""
    delay = FIRST_DELAY_S
    while True:
        yield delay
        delay = min(delay * 2, MAX_DELAY_S)


@contextlib.contextmanager
def main_module_hidden() -> Iterator[None]:
    """Start a worker without re-running the host's ``__main__`` in it.

    forkserver/spawn children re-import the parent's main script unless it
    is guarded by ``if __name__ == "__main__"``; workers never need it (they
    load programs by import path, or by dill by value), so the host's script
    is hidden while the process is launched. Runs on the event-loop thread,
    so no other thread sees the swap.
    """
    real = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = real
