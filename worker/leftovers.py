"""The asyncio tasks a program leaves running when its turn ends.

A program may start tasks of its own (``asyncio.create_task``) and return
without awaiting them. Left alone, such a task outlives its turn on the
worker's loop: it keeps a finished turn's context, takes time from the turns
that follow on that worker, and nothing ever reports it. A turn ends as
``asyncio.run`` ends its main coroutine: what the program left running is
cancelled, and awaited for a short grace, before the turn's closing records
are written (so whatever the cancelled tasks record as they stop comes before
``turn/end``). A task that ignores its cancellation past the grace is logged
and left; nothing can stop it short of its worker.

Which tasks are a turn's is known from where they were created: the loop's
task factory tags each new task with the turn (a context variable) whose
code created it. Tasks of the worker itself, and of other turns on the same
worker, are never touched. Only asyncio loops are tracked; another loop
(trio) has no way to leave a task running.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import weakref
from typing import Any, Coroutine, Iterator

__all__ = ["LEFTOVER_GRACE_S", "tracked", "untracked", "cancel_leftovers"]

log = logging.getLogger(__name__)

# how long the cancelled tasks get to finish their cleanup before the turn ends without them
LEFTOVER_GRACE_S = 1.0

_owner: contextvars.ContextVar["weakref.WeakSet[asyncio.Task[Any]] | None"] = contextvars.ContextVar(
    "subagents_turn_tasks", default=None
)


def _factory(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any) -> "asyncio.Task[Any]":
    task = asyncio.Task(coro, loop=loop, **kwargs)
    owned = _owner.get()
    if owned is not None:
        owned.add(task)
    return task


@contextlib.contextmanager
def tracked() -> Iterator["weakref.WeakSet[asyncio.Task[Any]]"]:
    """The tasks created by code running inside the block (and by the tasks they create), as a weak set.

    Outside asyncio, or on a loop that has a task factory of its own (which this would replace), the set
    stays empty.
    """
    owned: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        yield owned
        return
    factory = loop.get_task_factory()
    if factory is None:
        loop.set_task_factory(_factory)
    elif factory is not _factory:
        yield owned
        return
    token = _owner.set(owned)
    try:
        yield owned
    finally:
        _owner.reset(token)


@contextlib.contextmanager
def untracked() -> Iterator[None]:
    """Tasks created inside the block belong to no turn: the worker's own, started from a turn's code (a turn
    that parks on a child's result lets the worker start the next waiting turn, from the parked one's call)."""
    token = _owner.set(None)
    try:
        yield
    finally:
        _owner.reset(token)


async def cancel_leftovers(owned: "weakref.WeakSet[asyncio.Task[Any]]", *, who: str, grace_s: float = LEFTOVER_GRACE_S) -> int:
    """Cancel the tasks in ``owned`` still running, wait up to ``grace_s`` for them, and return how many there
    were. ``who`` names the turn in the log."""
    current = asyncio.current_task()
    running = [task for task in owned if not task.done() and task is not current]
    if not running:
        return 0
    for task in running:
        task.cancel()
    _, stubborn = await asyncio.wait(running, timeout=grace_s)
    names = ", ".join(sorted(_name(task) for task in running))
    log.warning("%s: the program left %d task(s) running (%s): cancelled", who, len(running), names)
    if stubborn:
        log.warning(
            "%s: %d task(s) ignored their cancellation for %g s and run on: %s",
            who, len(stubborn), grace_s, ", ".join(sorted(_name(task) for task in stubborn)),
        )
    for task in running:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: a failure in its cleanup is in the warning above, not "never retrieved"
    return len(running)


def _name(task: "asyncio.Task[Any]") -> str:
    coro = task.get_coro()
    return getattr(coro, "__qualname__", None) or task.get_name()
