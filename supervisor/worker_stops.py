"""Whether a local worker is stopped (SIGSTOP, Ctrl-Z, a debugger), read cheaply enough to ask at each dispatch.

A stopped worker handed a turn stalls it until it is continued, while another worker may idle; so the local
pool asks before it hands a worker a turn (``Dispatcher._takes_turns``), and passes a stopped one over.
The process state is read from ``/proc`` only for a worker that has said nothing for ``QUIET_S``: one that
sent a message that recently was running then, and a busy pool (the case whose cost counts) hands its turns
to workers that have just answered, so it reads nothing. A worker read as running is taken as running for
``QUIET_S`` more.

A worker stopped less than ``QUIET_S`` after it last spoke, or between the read and the turn's arrival,
can still be handed a turn; that turn, and every turn handed ahead to a worker then stopped, is taken back
through its token once the worker reads as stopped, and runs on a worker that takes turns
(``worker/claims.py``, ``Dispatcher._take_from_stopped``): within ``QUIET_S`` and a ``RECHECK_S`` or two.

Not guaranteed: a turn the worker started stalls until it is continued (or is cancelled: the worker is
killed after the cancel grace); so does every turn of a worker that cannot see the pool's tokens.
With every worker stopped, turns wait in the queue: no replacement is started, since a stop is someone's
on purpose (a debugger, an operator) and the pool keeps its size; it looks again every ``RECHECK_S``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from subagents.worker.descendants import stopped

__all__ = ["QUIET_S", "RECHECK_S", "StopState"]

log = logging.getLogger(__name__)

# how long a worker that spoke is taken for a running one: long enough that a busy pool never reads /proc,
# short enough that an idle worker stopped by hand is passed over from the next turn on
QUIET_S = 0.5
# how often the pool asks again whether a worker it passed over was continued, while a turn waits for one
RECHECK_S = 0.25


@dataclass
class StopState:
    """What the pool knows of one worker's being stopped; touched only on the supervisor's event loop."""

    heard_at: float = field(default_factory=time.monotonic)  # when it last sent a message, or was read as running
    stopped: bool = False  # read as stopped, and not seen running since (said once in the log)

    def heard(self) -> None:
        """It sent a message: it ran just now."""
        self.heard_at = time.monotonic()

    def takes_turns(self, pid: int) -> bool:
        """False while process ``pid`` is stopped (read only once it has been quiet for ``QUIET_S``)."""
        now = time.monotonic()
        if now - self.heard_at < QUIET_S:
            return True
        if not stopped(pid):
            self.heard_at = now
            if self.stopped:
                log.info("worker %s was continued; it takes turns again", pid)
                self.stopped = False
            return True
        if not self.stopped:
            log.warning("worker %s is stopped (SIGSTOP?); it is handed no turn until it is continued (kill -CONT %s)", pid, pid)
            self.stopped = True
        return False
