"""The event loop a supervisor answers on: every public call is checked against it.

A supervisor's threads (the store thread, the pool's readers) hand their
results back to the loop that opened it, so a call awaited on another loop
would wait for good, saying nothing; it is ``INVALID_REQUEST`` at once. A
plain ``def`` that a UI thread calls (``SubagentRun.cancel``) is handed to
that loop instead: what it starts (the worker's kill after the cancel grace)
must run there.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any, Callable, Coroutine, TypeVar

import anyio.lowlevel
from anyio.lowlevel import EventLoopToken

from .errors import InvalidRequestError, SupervisorClosedError

__all__ = [
    "current_loop", "require_asyncio", "require_loop", "on_loop", "to_its_end", "results_first", "hold_back", "deliver_held_back",
]

T = TypeVar("T")

log = logging.getLogger(__name__)


def current_loop() -> EventLoopToken | None:
    """The loop running in this thread, or None (a plain thread)."""
    try:
        return anyio.lowlevel.current_token()
    except RuntimeError:
        return None


def require_asyncio() -> None:
    """``INVALID_REQUEST`` unless the running loop is asyncio's: the worker pool waits on asyncio futures and
    timers, so under trio a supervisor opened, then every ``start`` failed with a bare ``RuntimeError``."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise InvalidRequestError('a supervisor runs on the asyncio event loop (anyio.run(..., backend="asyncio")), '
                                  "which its worker pool waits on; this loop is another (trio)") from None


def require_loop(loop: EventLoopToken) -> None:
    """``INVALID_REQUEST`` when called on another event loop than ``loop``; a plain thread passes (the
    synchronous reads, ``statistics()``, have no loop to wait on the wrong one)."""
    current = current_loop()
    if current is not None and current != loop:
        raise InvalidRequestError("this supervisor answers on the event loop that opened it: from another thread or event "
                                  "loop, call it through that loop (anyio.from_thread, a BlockingPortal)")


def on_loop(loop: EventLoopToken, func: Callable[..., Any], *args: Any) -> None:
    """``func(*args)`` on ``loop``: at once when called there, else scheduled there from this thread
    without waiting for it (a thread that waited would deadlock with a loop waiting for that thread,
    a UI's ``join``). ``SUPERVISOR_CLOSED`` when that loop no longer runs. The loop is asyncio's
    (``require_asyncio``)."""
    if current_loop() == loop:
        func(*args)
        return
    native: asyncio.AbstractEventLoop = loop.native_token
    if native.is_closed():  # the supervisor is long closed
        raise SupervisorClosedError()
    # in a task of that loop, not a bare callback: what ``func`` starts in a task group needs one
    call = _called(func, args)
    try:
        asyncio.run_coroutine_threadsafe(call, native)
    except RuntimeError:
        # the loop closed between the look above and the hand-over (the host's ``anyio.run`` ending as a
        # UI thread cancels): asyncio says so with a bare RuntimeError, and the call never runs
        call.close()  # not awaited, and never will be: no "never awaited" warning from the collector
        if native.is_closed():
            raise SupervisorClosedError() from None
        raise


async def _called(func: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        func(*args)
    except Exception:  # nobody waits for it: said here, or it would be lost in an unread future
        log.exception("%s, handed to the supervisor's event loop from another thread, failed", getattr(func, "__qualname__", func))


async def to_its_end(work: Coroutine[Any, Any, T]) -> tuple[T, asyncio.CancelledError | None]:
    """Run ``work`` to its end even if the awaiting task is cancelled natively meanwhile: its result, and that
    cancellation if one came (the caller raises it once it has done what must follow the work).

    An anyio shielded scope holds back anyio's cancellations only, not ``Task.cancel()``, which is how
    ``asyncio.run`` takes a Ctrl-C (and the CLI a SIGTERM or SIGHUP). One that landed in a shielded wait
    cut it: a supervisor's close stopped half-way and the host waited in ``select`` for good (the pool's
    pipe readers, which only that close ends, kept its task group open); a one-shot child's creation
    was rolled back before it ended, and the child was left made and leased, never released. ``work``
    runs in a task of its own here, which no cancellation of the awaiter reaches; call it inside a
    shielded scope, so that anyio's own cancellation is not delivered again and again while it runs.
    """
    task = asyncio.get_running_loop().create_task(work)
    cancelled: asyncio.CancelledError | None = None
    while True:
        try:
            return await asyncio.shield(task), cancelled
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
            if task.done():  # it ended as the cancellation came, or was cancelled itself (the loop ending)
                if task.cancelled():
                    raise
                return task.result(), cancelled  # a failure of the work is raised as it was


# A Ctrl-C (``asyncio.run``'s native ``Task.cancel()`` of the main task) that lands in a call after its message was
# accepted must not say "not sent" of that message: it ran on the next resume, and a host that sent it again ran it
# twice. A public call that returns such a result runs under ``results_first``; a native cancellation held back in
# it (``hold_back``, where a shielded wait was cut: the store thread's, a creation's) is given back to the task as
# the call returns, and raised at the task's next await; a call of the supervisor's begun then raises it before
# doing anything (``deliver_held_back``), or a loop of such calls would hold it back for good. Keyed by task, not
# by context: a task started inside the call (an activation's driver) copies the context, and must not hold back
# the cancellations of the loop's shutdown.
_HELD: "weakref.WeakKeyDictionary[asyncio.Task[Any], list[asyncio.CancelledError]]" = weakref.WeakKeyDictionary()
_REARMED: "weakref.WeakSet[asyncio.Task[Any]]" = weakref.WeakSet()


def results_first() -> "_ResultsFirst":
    """Around a public call whose result must reach its caller: a native cancellation held back in it is given
    back to the task when the call ends (raised at its next await). A call inside another is the outer's."""
    return _ResultsFirst()


class _ResultsFirst:
    """``results_first``'s context. A class, not a ``@contextmanager`` generator: every followup enters one,
    and the generator's frame and its two ``next`` calls cost about as much as the rest of it together."""

    __slots__ = ("_task", "_held")

    def __enter__(self) -> None:
        task = asyncio.current_task()
        if task is None or task in _HELD:
            self._task = None
            return
        self._task, self._held = task, []
        _HELD[task] = self._held

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        task = self._task
        if task is None:
            return
        _HELD.pop(task, None)
        if kind is None or not issubclass(kind, asyncio.CancelledError):  # else a cancellation is on its way out already
            _rearm(task, self._held)


def hold_back(cancelled: asyncio.CancelledError) -> bool:
    """Keep ``cancelled`` (a native one, from a shielded wait) for the call's return when a ``results_first``
    call is under way in this task; False: nobody would give it back, the caller raises it."""
    task = asyncio.current_task()
    held = _HELD.get(task) if task is not None else None
    if held is None:
        return False
    held.append(cancelled)
    return True


async def deliver_held_back() -> None:
    """At the start of a supervisor's call: raise a cancellation a call before it gave back to this task."""
    if not _REARMED:  # the usual case: no task has a cancellation given back
        return
    task = asyncio.current_task()
    if task is not None and task in _REARMED:
        _REARMED.discard(task)
        await asyncio.sleep(0)  # the pending cancellation is raised here


def _rearm(task: "asyncio.Task[Any]", held: list[asyncio.CancelledError]) -> None:
    if not held:
        return
    # the count ``asyncio.run`` checks stays one, so that it still makes the Ctrl-C a ``KeyboardInterrupt``
    task.uncancel()
    task.cancel(*held[0].args)
    _REARMED.add(task)
