"""A public call that could not get a thread says ``THREAD_START_FAILED``, not the interpreter's bare error.

The supervisor's blocking store calls run on threads: its store thread, and
anyio's worker threads when that one is busy. A host at its process limit
(``ulimit -u``) or out of memory for a stack cannot start one, and the
interpreter says so with a bare ``RuntimeError("can't start new thread")``,
which no ``except SubagentError`` sees. Nothing was done by a call that could
not start its thread (the call is the thread's work), so the coded error is
the whole truth, and the same call works once threads can be made again.

The public methods carry ``thread_failures_coded``: one place for every call
site under them, rather than a ``try`` around each of the many store calls.
"""

from __future__ import annotations

import functools
from typing import Awaitable, Callable, ParamSpec, TypeVar

from .errors import ThreadStartError

__all__ = ["thread_failure", "thread_failures_coded"]

P = ParamSpec("P")
T = TypeVar("T")


def thread_failure(exc: BaseException) -> ThreadStartError | None:
    """``exc`` as ``ThreadStartError`` when all it says is that threads could not be started: one such
    error, or a task group's exception group of nothing else (a call's concurrent store calls); else None."""
    if isinstance(exc, BaseExceptionGroup):
        if exc.split(lambda leaf: ThreadStartError.of(leaf) is not None)[1] is not None:
            return None
        first: BaseException = exc
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        return ThreadStartError.of(first)
    return ThreadStartError.of(exc)


def thread_failures_coded(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """``fn`` raising ``ThreadStartError`` where it raised the interpreter's bare thread-start error."""

    @functools.wraps(fn)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except (RuntimeError, BaseExceptionGroup) as exc:
            coded = thread_failure(exc)
            if coded is None or coded is exc:
                raise
            raise coded from exc

    return call
