"""The store thread: one long-lived thread per supervisor for the event loop's short blocking store calls.

An acceptance (``store.accept``: lock, append, fsync) blocks, so it runs off
the event loop. ``anyio.to_thread.run_sync`` costs 60–90 µs per call beyond
the call itself (a capacity limiter, a context copy, a worker thread's queue
and two futures; measured on the followup path, where it was a third of an
acceptance). Here the loop puts the call on a ``queue.SimpleQueue`` and the
thread answers with one ``call_soon_threadsafe`` that resolves an asyncio
future: about half of that, most of it the two thread wake-ups.

Invariants. As with ``to_thread``, ``run`` is a checkpoint (a caller
already cancelled is cancelled before the call begins), and a call once
begun runs to its end while its caller waits for it: the wait is shielded,
and a cancellation of the caller is delivered at its next checkpoint.
``run_uncancellable`` begins even for a cancelled caller (an acceptance
that must not be half-done, a settlement notice of a closing supervisor). The thread runs one call at a time, and a call made while it is
busy runs on anyio's worker threads instead: a slow call never holds a short
one behind it. After ``aclose``, and on an event loop other than asyncio,
every call takes anyio's worker threads. Owned by the ``Runtime`` (one per
supervisor), closed by the ``Supervisor`` after everything that uses it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import anyio

from .errors import ThreadStartError
from .event_loop import hold_back

__all__ = ["StoreThread", "StoreThreadStatistics"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# what the loop hands the thread: where to answer, the future to resolve, the caller's context
# (as ``to_thread`` does: a log line of the call carries the fields its task bound), the call
_Call = tuple[asyncio.AbstractEventLoop, "_Pending", contextvars.Context, Callable[..., Any], tuple[Any, ...]]


@dataclass(frozen=True)
class StoreThreadStatistics:
    calls: int  # calls the store thread ran
    overflow: int  # calls that took anyio's worker threads (the store thread busy or closed, or no asyncio loop)
    # seconds the store thread spent in its calls (their own time: an acceptance's lock, append and
    # fsync, without the hand-over to and from the loop, which is the rest of the caller's wait)
    busy_s: float = 0.0


class StoreThread:
    """Runs blocking store calls for one event loop on one long-lived thread (started at the first call)."""

    def __init__(self, name: str = "subagents-store") -> None:
        self._name = name
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        # event-loop side only: a call is on the thread now; closed
        self._busy = False
        self._closed = False
        self._calls = 0
        self._overflow = 0
        self._busy_s = 0.0  # written by the thread only

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` off the event loop; its result, or its exception raised here. A checkpoint first."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        return await self.run_uncancellable(fn, *args)

    async def run_uncancellable(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` off the event loop, begun and awaited to its end even when the caller is cancelled."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # another event loop (trio): anyio's portable threads
            loop = None
        if loop is None or self._busy or self._closed:
            self._overflow += 1
            with anyio.CancelScope(shield=True):  # to_thread's own checkpoint included
                return await anyio.to_thread.run_sync(fn, *args)
        if self._thread is None:
            thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            try:
                thread.start()
            except RuntimeError as exc:  # can't start new thread: kept, it would have left every later call to nobody
                raise ThreadStartError("the store's calls", exc) from None
            self._thread = thread
        self._calls += 1
        self._busy = True
        try:
            with anyio.CancelScope(shield=True):
                # the hand-over last: the thread it wakes takes the GIL once this loop waits (in its ``epoll``),
                # and one woken while the loop still runs sleeps again until the loop lets go of it
                call = _Pending(loop.create_future())
                self._queue.put((loop, call, contextvars.copy_context(), fn, args))
                while True:
                    try:
                        await call.waiter
                    except asyncio.CancelledError as exc:
                        # native (anyio's own never reaches a shielded wait): a Ctrl-C through ``asyncio.run``. Held
                        # back for the public call to give back once it returns the call's result, or raised
                        if not hold_back(exc):
                            raise  # nobody waits for its outcome any more: ``_settle`` finds its waiter done
                        if call.outcome is None:
                            call.waiter = loop.create_future()  # the cancelled one is done: wait on afresh
                        continue
                    ok, value = call.outcome
                    if ok:
                        return value
                    raise value
        finally:
            self._busy = False

    def statistics(self) -> StoreThreadStatistics:
        return StoreThreadStatistics(calls=self._calls, overflow=self._overflow, busy_s=self._busy_s)

    async def aclose(self) -> None:
        """Stop the thread after the call it runs (if any); later calls take anyio's worker threads."""
        self._closed = True
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            await anyio.to_thread.run_sync(thread.join)

    def _serve(self) -> None:
        while True:
            call = self._queue.get()
            if call is None:
                return
            loop, pending, context, fn, args = call
            started = time.perf_counter()
            try:
                outcome: tuple[bool, Any] = (True, context.run(fn, *args))
            except BaseException as exc:  # the caller's to raise, never lost with the thread
                outcome = (False, exc)
            self._busy_s += time.perf_counter() - started
            try:
                loop.call_soon_threadsafe(_settle, pending, *outcome)
            except RuntimeError:  # the loop closed under the call: nobody waits for it any more
                log.warning("a store call finished after its event loop closed", exc_info=None if outcome[0] else outcome[1])


class _Pending:
    """A call handed to the thread: its outcome, once ``_settle`` gave it, and the future its caller awaits.

    The caller awaits ``waiter``, never a future the thread resolves: a native ``Task.cancel()`` cancels what
    its task awaits, and the call's outcome must outlive that (a held-back Ctrl-C waits on with a new
    waiter). ``asyncio.shield`` did the same with an outer future and two callbacks, which cost each call a
    pass of the event loop more between the thread's answer and the caller's wake-up."""

    __slots__ = ("outcome", "waiter")

    def __init__(self, waiter: "asyncio.Future[None]") -> None:
        self.outcome: tuple[bool, Any] | None = None
        self.waiter = waiter


def _settle(call: _Pending, ok: bool, value: Any) -> None:
    """On the event loop: hand the call's outcome to its waiting caller."""
    call.outcome = (ok, value)
    if not call.waiter.done():  # done: its task was cancelled natively (a loop's shutdown) and nobody waits for it
        call.waiter.set_result(None)
