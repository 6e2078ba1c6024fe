"""Crash points of the store's multi-step operations (``migrate``, ``gc``, ``reindex``), for the crash tests.

Each change such an operation makes (a folder made, a rename, an index append, a removal) is one
step; the crash tests stop a run right after every one of them in turn, which a kill at a random
moment would reach only by chance. Nothing happens unless the operation's environment variable
is set.
"""

from __future__ import annotations

import os
import signal

__all__ = ["Steps"]


class Steps:
    """Counts the changes a multi-step operation (``migrate``, ``gc``) makes; with the environment
    variable ``env`` set to N the process SIGKILLs itself right after the N-th. Test-only: the
    crash tests stop a run at every one of its steps, which a kill at a random moment would reach
    only by chance."""

    def __init__(self, env: str) -> None:
        self.count = 0
        self.kill_after = int(os.environ.get(env) or 0)

    def done(self) -> None:
        self.count += 1
        if self.count == self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
