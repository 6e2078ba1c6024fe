"""What a host process's ``os.fork`` and its exit do to the workers of its local pools.

Both are process-wide hooks, registered once at import, that reach every
``WorkerPool`` of the process (tracked weakly: a pool that is gone needs
nothing). Each pool does the work on its own workers (``disown_after_fork``,
``let_go_at_exit``); this module only says when.

**After a fork**, in the child: a process ``os.fork`` made from a host has a
copy of the host's event loop, and whatever it runs of it (a ``sys.exit``
unwinding the supervisor's ``async with``) read the host's worker pipes: the
reply a worker sent for the host's turn went to the fork, and the host waited
for it for good. And ``multiprocess`` lists every process it started as a
child: a forked copy of that list made the fork's exit (its ``atexit`` handler
terminates daemonic children) SIGTERM the host's workers. ``multiprocess``
clears that list itself in a child it starts; a bare ``os.fork`` needs this.

**At exit**: a host leaves its supervisor open when a second Ctrl-C raises
``KeyboardInterrupt`` out of its event loop while the first one's close waits
for the turns (or any error unwinds the loop past the ``async with``).
``multiprocess``'s own exit handler then SIGTERMs its daemonic children and
joins them; a worker outlives SIGTERM (``worker/signals.py``) and waits for its
host's end of the pipe to close, which only the host's exit closes: the host
hung at exit for good, its workers with it. Registered after
``multiprocess``'s (imported first), this handler runs before it: each open
pool closes the host's ends of its pipes (a worker exits at the hang-up),
kills what still runs after ``EXIT_GRACE_S``, and leaves ``multiprocess``
nothing to wait for. The turns those workers ran are left as a ``kill -9``
leaves them, for the next host's crash repair.
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import Protocol

import multiprocess.util  # noqa: F401  (registers multiprocess's exit handler first: ours runs before it)

__all__ = ["EXIT_GRACE_S", "HookedPool", "track_pool"]

EXIT_GRACE_S = 1.0  # how long the interpreter's exit waits for the workers of a pool left open to go, before it kills them


class HookedPool(Protocol):
    def disown_after_fork(self) -> None: ...

    def let_go_at_exit(self) -> None: ...


_POOLS: "weakref.WeakSet[HookedPool]" = weakref.WeakSet()


def track_pool(pool: HookedPool) -> None:
    """Reach ``pool`` from this process's fork and exit hooks for as long as it lives."""
    _POOLS.add(pool)


def _disown_workers() -> None:
    for pool in list(_POOLS):
        pool.disown_after_fork()


def _let_workers_go_at_exit() -> None:
    for pool in list(_POOLS):
        pool.let_go_at_exit()


os.register_at_fork(after_in_child=_disown_workers)
atexit.register(_let_workers_go_at_exit)
