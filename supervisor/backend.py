"""The ``Pool`` seam: how the supervisor runs turns, whatever runs them.

The supervisor (one-shot runs, the continuable driver, the service) talks to
workers only through this protocol. ``WorkerPool`` (``supervisor/pool.py``,
local processes) implements it; a pool over a cluster's actors can too.

A turn's life: ``run_turn`` queues it and calls ``started(ticket)`` before
its first await, so the caller can ``cancel(ticket, reason)`` at any time;
it returns a ``TurnResult`` once the turn is over (``submit`` does the same
for a caller with no task to wait in: it hands the result to a callback). The result says whether a
worker ever took the turn (``dispatched``: only then can the turn have
written to its log), whether that worker died under it (``crashed``: the log
needs repair) and the ``outcome``. A pool never raises for a turn's failure;
it raises ``SupervisorClosedError`` only for a turn queued after ``aclose``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

import anyio

from subagents.worker.protocol import TurnOutcome, TurnSpec

__all__ = ["ChildRun", "Pool", "PoolStatistics", "RpcHandler", "TurnChildren", "TurnRpcHandler", "TurnResult", "TurnTicket", "WorkerRef", "StartedCallback"]

# What a turn asks of its supervisor (``supervisor/rpc.py`` answers): method name, arguments.
RpcHandler = Callable[[str, dict[str, Any]], Awaitable[Any]]


class ChildRun(Protocol):
    """What stopping and disposing a turn's tree needs of each one-shot run in it (``oneshot.SubagentRun``)."""

    id: str

    @property
    def done(self) -> bool: ...

    def cancel(self, reason: str = "user") -> None: ...

    async def result(self) -> Any: ...

    def started_runs(self) -> list[ChildRun]:
        """The runs its own turn started, oldest first."""
        ...


class TurnChildren(Protocol):
    """The one-shot children a turn started (its RPC handler keeps them): stopped and disposed with the run."""

    def cancel_children(self, reason: str) -> None: ...

    def started_runs(self) -> list[ChildRun]:
        """The runs the turn started, oldest first (``SubagentRun.dispose`` walks them, and theirs, level by level)."""
        ...

    async def starts_done(self) -> None:
        """Return once no child start of the turn is in progress."""
        ...


class TurnRpcHandler(RpcHandler, TurnChildren, Protocol):
    """A turn's RPC handler (``supervisor/rpc.py``): answers its requests, owns the children it starts."""


class TurnTicket(Protocol):
    """A pool's handle on one queued or running turn; opaque to callers, who only pass it to ``cancel``."""

    call_id: int


StartedCallback = Callable[[TurnTicket], None]


@dataclass(frozen=True)
class WorkerRef:
    """Where a turn ran: the worker's host and process id."""

    host: str
    pid: int


@dataclass(frozen=True)
class TurnResult:
    """How one turn ended, as the pool saw it."""

    outcome: TurnOutcome
    worker: WorkerRef | None  # the worker that took the turn; None: stopped before any did
    # why the turn was asked to stop (``Pool.cancel``'s reason: ``user``, ``parent``, ...), if it was: a crash
    # repair records it as the ``turn/end``'s cause (a worker killed for ignoring a cancel died because of
    # it), and a message dropped unrun as its ``message/discarded`` cause
    cancel_reason: str | None = None
    # how its worker died under it (``worker process 1234 exited with code 3``), if it did: the repair says so
    crash: str | None = None

    @property
    def crashed(self) -> bool:
        """The worker died (or was killed) under the turn: its log needs repair."""
        return self.crash is not None

    @property
    def dispatched(self) -> bool:
        """A worker took the turn, so it may have written to its log."""
        return self.worker is not None


@dataclass(frozen=True)
class PoolStatistics:
    size: int
    workers_alive: int
    queued: int  # turns not started: in the pool's queue, or handed to a worker ahead and waiting there
    resident: int  # turns started in a worker and not ended (as far as the pool has heard)
    parked: int
    started: int
    crashed: int
    ahead: int = 0  # of ``queued``: handed to a worker ahead of a free slot (prefetch), waiting there
    withdrawn: int = 0  # turns handed ahead, then given back unstarted to run on a worker that fell idle
    store_service_restarts: int = 0  # the Ray pool's store service died and was replaced (its workers with it)


class Pool(Protocol):
    """Runs turns in workers. Every method runs on the supervisor's event loop."""

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Start the workers (and the pool's own tasks in ``tg``); returns once they are ready."""
        ...

    async def aclose(self) -> None:
        """Abort queued turns, stop the workers; later ``run_turn`` calls raise ``SupervisorClosedError``."""
        ...

    async def run_turn(self, spec: TurnSpec, on_rpc: RpcHandler, *, started: StartedCallback | None = None) -> TurnResult:
        """Queue a turn, serve its RPCs with ``on_rpc``, and return how it ended."""
        ...

    def submit(
        self, spec: TurnSpec, on_rpc: RpcHandler, *, on_done: Callable[[TurnResult], None], started: StartedCallback | None = None,
    ) -> TurnTicket:
        """``run_turn`` without a waiting task: queue the turn and call ``on_done`` with how it ended, on the
        event loop (from inside ``submit`` when ``started`` cancels it). ``SupervisorClosedError`` after ``aclose``."""
        ...

    def cancel(self, ticket: TurnTicket, reason: str = "user") -> None:
        """Ask a turn to stop: a queued turn ends ``aborted`` undispatched; a running one is told, then
        its worker is killed if it ignores that past the grace period. Idempotent."""
        ...

    def statistics(self) -> PoolStatistics: ...

    def workers(self) -> list[WorkerRef]:
        """The live workers."""
        ...
