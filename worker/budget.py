"""Budgets and stop causes of one turn.

A turn stops for the *first* cause only: a cancellation that came first is
never rewritten by a timer that fires later, and vice versa (``TurnControl``
keeps the first). ``max_steps`` is counted by ``ctx.step()``; ``timeout_ms``
is wall clock from the turn's start.
"""

from __future__ import annotations

from typing import Literal

import anyio

from .errors import BudgetExhaustedError, TurnGoneError
from .forks import forked

__all__ = ["StopCause", "TurnStopped", "TurnControl", "TIMEOUT"]

StopCause = Literal["aborted", "budget-exhausted"]

# why a turn stopped at its ``timeout_ms`` (``turn/end``'s ``cause``): its own timer, or the host's cancel,
# whose reason this is when it holds the budget for a worker that ignored its timer (``supervisor/dispatch.py``)
TIMEOUT = "timeout"


class TurnStopped(Exception):
    """Raised inside a turn (at a step) once the turn has been told to stop."""

    def __init__(self, cause: StopCause) -> None:
        super().__init__(cause)
        self.cause = cause


class TurnControl:
    """The stop switch of one turn, safe to read from a program's thread."""

    def __init__(self, *, max_steps: int | None, timeout_ms: int | None = None) -> None:
        self.max_steps = max_steps
        self.timeout_ms = timeout_ms
        self.steps = 0
        self.cause: StopCause | None = None
        self.diagnostic: str | None = None
        self.why: str | None = None  # what set the cause: "timeout", "max_steps", or a cancel reason
        self.scope = anyio.CancelScope()
        self.ended = False  # the turn's end is written: a context a program kept past it records nothing more

    @property
    def stopping(self) -> bool:
        """Whether the turn was told to stop; safe from a program's thread (``cause`` is set once, first).

        A plain attribute, not a ``threading.Event``: nothing waits on it, and an
        event (a condition and its lock) cost every turn a few microseconds.
        """
        return self.cause is not None

    def stop(self, cause: StopCause, diagnostic: str | None = None, *, why: str | None = None) -> bool:
        """Record the cause (first one wins) and cancel the turn; False if already stopping.

        ``why`` goes into ``turn/end`` as ``cause`` so listings tell a timeout from a
        step budget, and a user's interrupt from a drain (store/outcome.py).
        """
        if self.cause is not None:
            return False
        self.cause, self.diagnostic, self.why = cause, diagnostic, why
        self.scope.cancel()
        return True

    def time_out(self) -> bool:
        """Stop at the wall-clock budget (first cause wins): the turn's own timer, or the host's cancel
        with reason ``TIMEOUT``, which reads the same in the log."""
        return self.stop("budget-exhausted", f"the turn exceeded timeout_ms={self.timeout_ms}", why=TIMEOUT)

    def check(self) -> None:
        if self.ended:
            raise TurnGoneError()
        if forked():
            raise TurnGoneError.forked()
        if self.cause is not None:
            raise TurnStopped(self.cause)

    def default_max_steps(self, max_steps: int) -> None:
        """A step budget when the turn has none (``TurnContext.limit_steps``)."""
        if self.max_steps is None:
            self.max_steps = max_steps

    def count_step(self) -> int:
        self.check()
        self.steps += 1
        if self.max_steps is not None and self.steps > self.max_steps:
            self.stop("budget-exhausted", f"the turn exceeded max_steps={self.max_steps}", why="max_steps")
            raise BudgetExhaustedError(f"the turn exceeded max_steps={self.max_steps}")
        return self.steps
