"""How long a public call may wait for a child's file lock before it writes: its caller's deadline, at most 30 s.

A message accepted into a child's mailbox, or an interrupt's control record,
is appended under the child's session lock (an ``flock`` on its file). A
process stopped inside that lock's critical section (SIGSTOP, a debugger, a
frozen container) holds it for good, and nothing outside can break an
``flock``. The acceptance runs to its end once begun (shielded: a message is
never half-accepted, and a caller told "not sent" must not see it run), so a
caller's ``anyio.fail_after(3)`` waited as long as the stopped holder did,
and a call without a deadline waited for ever.

Waiting for the lock writes nothing, so that part may end early:
- at the caller's deadline (anyio's effective deadline, taken where the public
  call began): the caller's own cancellation is raised, as anywhere else its
  deadline passes: ``fail_after`` says ``TimeoutError``, ``move_on_after``
  moves on, and nothing was accepted;
- after ``LOCK_TIMEOUT_S`` without a nearer deadline: ``LockTimeoutError``
  (``LOCK_TIMEOUT``), nothing accepted, as a lease take behind a stopped
  holder says.
The supervisor's own deliveries (a settlement notice to a parent) pass no
``LockWait``: they wait for the lock as the writers do, since a notice that
gave up would be lost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from subagents.store import LockTimeoutError
from subagents.store.locks import LOCK_TIMEOUT_S

__all__ = ["LockWait", "bounded"]

T = TypeVar("T")


@dataclass(frozen=True)
class LockWait:
    """The lock-wait budget of one public call: its caller's deadline (anyio's clock; ``inf``: none)."""

    deadline: float = math.inf

    @classmethod
    def of_caller(cls) -> "LockWait":
        """The running task's effective deadline, taken outside any shield the call enters later."""
        return cls(anyio.current_effective_deadline())

    def timeout(self) -> float:
        """Seconds a lock wait may take from now: to the deadline, at most ``LOCK_TIMEOUT_S``."""
        return min(LOCK_TIMEOUT_S, max(0.0, self.deadline - anyio.current_time()))

    async def run(self, call: Callable[[float], Awaitable[T]]) -> T:
        """``call(timeout)``; a ``LockTimeoutError`` that the deadline caused becomes the caller's cancellation."""
        timeout = self.timeout()
        try:
            return await call(timeout)
        except LockTimeoutError:
            if timeout < LOCK_TIMEOUT_S:
                # the caller's deadline cut the wait: its cancellation (``fail_after``'s TimeoutError), raised
                # here at the deadline, says "not sent" as truly as the lock timeout would
                await anyio.sleep_until(self.deadline)
            raise


async def bounded(wait: LockWait | None, call: Callable[[float | None], Awaitable[T]]) -> T:
    """``call(timeout)`` under ``wait`` (``LockWait.run``); ``call(None)``, a wait as long as the lock's
    holder takes, without one (the supervisor's own deliveries)."""
    if wait is None:
        return await call(None)
    return await wait.run(call)
