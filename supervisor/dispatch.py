"""``Dispatcher``: the turn queue, dispatch, parking and cancellation every pool shares.

    run_turn() ──▶ queue ──_schedule()──▶ _hand_over(worker, turn)       (the pool's way: a pipe, an actor call)
    a turn's Rpc ──_serve_rpc()──▶ on_rpc ──▶ _send_reply(worker, turn, reply)
    a turn's TurnDone ──_turn_done()──▶ its outcome;  a worker's death ──_end_resident()──▶ error / aborted

Dispatch rule: a worker takes a queued turn only while fewer than
``turns_per_worker`` of its resident turns are *running*. A turn blocked in a
waiting RPC (``spawn_wait``, ``wait_run``) is *parked*: it stays resident but
no longer counts, so the children it waits for can run on that worker, and
nested delegation never deadlocks, at any depth and pool size. When the wait
ends the turn resumes where it is (brief oversubscription, never a deadlock).
A worker the pool says would stall a turn (``_takes_turns``: the local pool's
stopped one, ``worker_stops.py``) is passed over, and asked again shortly.

Cancellation: a queued turn ends ``aborted`` without a worker; a dispatched
one is told (``_send_cancel``), and if it ignores that for ``cancel_grace_s``
its worker is killed (``_kill_worker``), which ends the turns resident there.

Prefetch (``prefetch`` > 0, the local pool): once every slot is taken, each
worker is handed up to ``prefetch`` more turns marked ``queued``. They wait
in the worker, which starts the next the moment a running turn ends or parks:
the worker never idles for the round trip of its ``TurnDone`` and the next
``RunTurn`` (which, on 2 busy cores, was longer than a short turn itself).
Such a turn is ``queued`` here until the worker's ``Started`` comes. It is
asked back (``_send_withdraw``) when the queue is empty and another worker has
a free slot, or once it has waited ``AHEAD_WAIT_S`` (the turn in front of it
is long) while another worker takes turns (a stopped one counts for neither):
given back, it is first in line and takes the next free slot on any worker,
before every turn queued after it, and is never handed ahead again
(dispatch holds back for the answer, ``WITHDRAW_WAIT_S`` at most: a worker
whose event loop a turn blocks cannot answer).
So a short turn never waits behind a long one while a worker idles, and with
long turns (model calls) prefetch steps aside. A stopped worker cannot answer a
withdraw: a turn it has not started (waiting ahead, or handed to its free slot
just before or after it was stopped) is taken back unasked, through the token
it was handed over with (``worker/claims.py``: the worker takes it before it
starts the turn, so only one side can), while another worker takes turns; a
cancel takes such a turn back too. A worker that dies before
sending ``Started`` never wrote a byte of that turn: it is queued again, first
in line, instead of ending ``error``.

The local pool (``pool.py``: processes and pipes) and the Ray pool
(``ray_pool.py``: actors) subclass it and supply those four ways of reaching a
worker; how workers start and how their deaths are seen stays theirs. One
owner for the mutable state: everything runs on the supervisor's event loop,
so the queue and the turn tables need no lock. (Over 500 lines: the
dispatch rule, parking, cancellation and prefetch all read and change those
tables; split apart, each would reach into the others' state.)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Generic, Iterator, TypeVar, cast

import anyio

from subagents.store.errors import SubagentError
from subagents.worker.budget import TIMEOUT
from subagents.worker.claims import PoolTokens
from subagents.worker.protocol import BLOCKING_RPCS, CancelRpc, Reply, Rpc, TurnOutcome, TurnSpec, cancelled_before_start

from .backend import PoolStatistics, RpcHandler, StartedCallback, TurnResult, TurnTicket, WorkerRef
from .errors import RpcError, SupervisorClosedError
from .thread_failures import thread_failure
from .worker_stops import RECHECK_S

__all__ = ["Dispatcher", "Turn", "WorkerSlot"]

log = logging.getLogger(__name__)

# how long a turn handed ahead may wait behind a running turn before a slot freed on another
# worker takes it back: long enough that a short turn ahead starts where it is (no messages),
# short against a model call, which would otherwise hold it while newer turns run elsewhere
AHEAD_WAIT_S = 0.05
# how long dispatch holds back for the answer to a withdraw, so that nothing overtakes the turn
# asked back; bounded because a worker whose event loop a turn blocks cannot answer at all
WITHDRAW_WAIT_S = 0.5

# how long past a turn's ``timeout_ms`` the host waits before it stops the turn itself (``_hold_budget``)
BUDGET_SLACK_S = 0.25


def _overran(turn: "Turn") -> str:
    return f"the turn exceeded timeout_ms={turn.spec.budget.timeout_ms}"


@dataclass(eq=False)
class Turn:
    """One queued or resident turn: the pool's ticket (``TurnTicket``), owned by the pool's tasks."""

    call_id: int
    spec: TurnSpec
    on_rpc: RpcHandler
    done: anyio.Event = field(default_factory=anyio.Event)
    outcome: TurnOutcome | None = None
    crash: str | None = None  # how its worker died under it, if it did (its log needs repair)
    worker: "WorkerSlot | None" = None
    parked: int = 0  # waiting RPCs in progress: a parked turn does not hold its worker's slot
    cancel_reason: str | None = None
    on_done: Callable[[TurnResult], None] | None = None  # ``submit``'s callback
    queued: bool = False  # handed over ahead (prefetch) and not known to have started
    handed_at: float = 0.0  # when it was handed over ahead (``time.monotonic``)
    withdrawing: bool = False  # asked back from its worker (``Withdraw``), no answer yet
    asked_at: float = 0.0  # when it was asked back (``time.monotonic``)
    returned: bool = False  # given back once: from then on it waits for a free slot, never ahead
    token: str | None = None  # its token, until its worker is known to have taken it (``worker/claims.py``)
    budget_timer: asyncio.TimerHandle | None = None  # the host's hold on ``timeout_ms`` (``_hold_budget``)

    @property
    def askable(self) -> bool:
        """Waiting ahead in a worker, and neither asked back already nor cancelled (a cancel ends it there)."""
        return self.queued and not self.withdrawing and self.cancel_reason is None

    def result(self) -> TurnResult:
        """How it ended, and where it ran: nowhere (not ``dispatched``) if it never started, even when
        handed to a worker ahead (it ended there unwritten: cancelled, or its worker closed or died)."""
        assert self.outcome is not None
        ran = self.worker is not None and not self.queued
        return TurnResult(self.outcome, self.worker.ref() if ran else None, self.cancel_reason, self.crash)


@dataclass(eq=False)
class WorkerSlot:
    """One worker as the dispatcher sees it: its place in the pool, its pid, its resident turns.
    A pool's worker record subclasses it with what reaching that worker takes."""

    index: int
    pid: int
    turns: dict[int, Turn] = field(default_factory=dict, kw_only=True)
    alive: bool = field(default=True, kw_only=True)
    tokens: bool = field(default=False, kw_only=True)  # it takes the pool's tokens (the turns handed to it carry one)

    @property
    def running(self) -> int:
        return sum(1 for t in self.turns.values() if t.parked == 0)

    def ref(self) -> WorkerRef:
        """Where this worker runs, as a turn's result names it."""
        raise NotImplementedError

    def describe(self) -> str:
        """The worker in a log line."""
        return str(self.pid)


W = TypeVar("W", bound=WorkerSlot)


class Dispatcher(Generic[W]):
    """The ``Pool`` protocol's turn handling over ``size`` worker slots; a pool supplies its workers."""

    def __init__(self, *, size: int, turns_per_worker: int, cancel_grace_s: float, prefetch: int = 0) -> None:
        self.size = size
        self._turns_per_worker = turns_per_worker
        self._prefetch = prefetch
        self._cancel_grace_s = cancel_grace_s
        self._slots: list[W | None] = [None] * size  # None: not started yet, or dead and not replaced yet
        self._queue: deque[Turn] = deque()
        self._call_ids = itertools.count(1)
        self._tg: anyio.abc.TaskGroup | None = None
        self._closing = False
        self._started = 0
        self._crash_count = 0
        self._withdrawn = 0
        self._shields: set[anyio.CancelScope] = set()  # the pool's tasks a caller's cancellation must not end
        # the waits a turn may give up (``BLOCKING_RPCS``), by worker and rpc id: a ``CancelRpc`` cancels one
        self._waits: dict[tuple[int, int], anyio.CancelScope] = {}
        self._asking_again = False  # ``_ask_again`` is due
        self._tokens: PoolTokens | None = None  # a pool that can take turns back unasked makes them (``_take_from_stopped``)

    # -- the pool's tasks and the caller's cancellation ---------------------------------

    @contextlib.contextmanager
    def _shielded(self) -> Iterator[anyio.CancelScope]:
        """A scope shielded from the caller's cancellation, ended by the pool's close (``_end_shielded``).

        The pool's tasks run in the supervisor's task group: a caller's deadline or task group around
        ``Supervisor.open`` cancels them with the body, and the close that follows then waited out its
        bounds (``cancel_grace_s + 10`` s) for answers nobody carried or read. Whatever tells a worker to
        stop a turn, enforces that, or reads the turn's answer runs in one: the local pool's pipe reader
        has such a scope per worker (``pool.py``); a task about one turn (the Ray pool's stream of it, its
        cancel call; ``_enforce_cancel``) takes one here. Entered before the task's first checkpoint, so
        a task started after the caller's cancel is covered too.
        """
        scope = anyio.CancelScope(shield=True)
        self._shields.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._shields.discard(scope)

    def _end_shielded(self) -> None:
        """At the end of close: the shielded tasks still running end (their workers are gone)."""
        for scope in list(self._shields):
            scope.cancel()

    # -- what a pool supplies ------------------------------------------------------

    def _hand_over(self, worker: W, turn: Turn) -> bool:
        """Start ``turn`` on ``worker``; False if the worker is already gone (the turn stays first in line)."""
        raise NotImplementedError

    def _send_cancel(self, worker: W, turn: Turn, reason: str) -> None:
        """Tell ``worker`` to stop ``turn`` (cooperative: the grace period follows)."""
        raise NotImplementedError

    async def _send_reply(self, worker: W, turn: Turn | None, reply: Reply) -> None:
        """Give ``worker`` the answer to one of its turn's RPCs (the worker is alive when called)."""
        raise NotImplementedError

    def _kill_worker(self, worker: W) -> None:
        """Kill a worker whose turn ignored its cancellation; its death is then seen as any other."""
        raise NotImplementedError

    def _send_withdraw(self, worker: W, turn: Turn) -> None:
        """Ask ``worker`` to give back ``turn``, handed over ahead, if it has not started it (a pool with prefetch)."""
        raise NotImplementedError

    def _takes_turns(self, worker: W) -> bool:
        """Whether ``worker``, alive, may be handed a turn now; a pool that can tell a worker that would stall it
        (the local pool's stopped one) says False, and calls ``_schedule`` again once that may have changed."""
        return True

    # -- turns ---------------------------------------------------------------------

    async def run_turn(self, spec: TurnSpec, on_rpc: RpcHandler, *, started: StartedCallback | None = None) -> TurnResult:
        """Queue a turn and wait for how it ended."""
        turn = self._queue_turn(Turn(next(self._call_ids), spec, on_rpc), started)
        await turn.done.wait()
        return turn.result()

    def submit(
        self, spec: TurnSpec, on_rpc: RpcHandler, *, on_done: Callable[[TurnResult], None], started: StartedCallback | None = None,
    ) -> TurnTicket:
        """Queue a turn; ``on_done`` gets how it ended, on the event loop (before ``submit`` returns when
        ``started`` cancels it). A callback instead of a waiting task: a task costs ~20 µs of CPU to start."""
        return self._queue_turn(Turn(next(self._call_ids), spec, on_rpc, on_done=on_done), started)

    def _queue_turn(self, turn: Turn, started: StartedCallback | None) -> Turn:
        if self._closing:
            raise SupervisorClosedError()
        self._queue.append(turn)
        if started is not None:
            started(turn)
        self._schedule()
        return turn

    def cancel(self, ticket: TurnTicket, reason: str = "user") -> None:
        """Ask a turn to stop; kill its worker if it ignores that past the grace period. A turn its worker has
        not taken (``_end_untaken``) ends without it instead, at once if the worker is stopped: a stopped
        worker cannot act on a cancel, and was killed after the grace with the turns it had started."""
        assert isinstance(ticket, Turn), "a ticket of another kind of pool"
        turn = ticket
        if turn.done.is_set() or turn.cancel_reason is not None:
            return
        turn.cancel_reason = reason
        if turn.worker is None:
            if turn in self._queue:
                self._queue.remove(turn)
            self._finish(turn, cancelled_before_start(reason))
            return
        if not self._takes_turns(cast(W, turn.worker)) and self._end_untaken(turn):
            return
        self._send_cancel(cast(W, turn.worker), turn, reason)
        assert self._tg is not None
        self._tg.start_soon(self._enforce_cancel, turn)

    async def _enforce_cancel(self, turn: Turn) -> None:
        with self._shielded() as shield, anyio.move_on_after(self._cancel_grace_s):
            await turn.done.wait()
            return
        if shield.cancel_called:
            return  # the pool closed: its workers are gone
        worker = turn.worker
        if worker is not None and worker.alive and not turn.done.is_set():
            if self._end_untaken(turn):  # its worker never took it (stopped, or its loop blocked): spared
                return
            log.warning("turn ignored cancellation for %.1fs; killing worker %s", self._cancel_grace_s, worker.describe())
            self._kill_worker(cast(W, worker))

    def _end_untaken(self, turn: Turn) -> bool:
        """A cancelled turn whose token its worker has not taken (``_revoke``) ends unstarted, off that worker,
        which is not told (it drops its copy when it comes to it); False if the worker took it."""
        if turn.worker is None or not self._revoke(turn):
            return False
        del turn.worker.turns[turn.call_id]
        self._take_back(turn, returned=False)
        self._schedule()
        return True

    def _hold_budget(self, turn: Turn) -> None:
        """Past its ``timeout_ms`` (and ``BUDGET_SLACK_S``, so that the worker's own timer, which ends the
        turn ``budget-exhausted`` in its log, normally comes first), a running turn is cancelled with the
        reason ``timeout``, so a worker whose program ignores its timer (a blocked event loop, a thread
        that never looks at the stop flag) is killed after ``cancel_grace_s`` as for an interrupt. A
        timer handle, not a task: most turns end long before it, and cancel it (``_finish``)."""
        timeout_ms = turn.spec.budget.timeout_ms
        if timeout_ms is not None and turn.budget_timer is None:
            turn.budget_timer = asyncio.get_running_loop().call_later(timeout_ms / 1000.0 + BUDGET_SLACK_S, self.cancel, turn, TIMEOUT)

    def _finish(self, turn: Turn, outcome: TurnOutcome, *, crash: str | None = None) -> None:
        """``crash``: how the turn's worker died under it (its log needs repair, which records this)."""
        if turn.done.is_set():
            return
        if turn.budget_timer is not None:
            turn.budget_timer.cancel()
        self._revoke(turn)  # a token its worker never took (it died, or the pool closed): removed
        turn.outcome, turn.crash = outcome, crash
        if turn.worker is not None:
            turn.worker.turns.pop(turn.call_id, None)
        turn.done.set()
        if turn.on_done is not None:
            try:
                turn.on_done(turn.result())
            except Exception:  # isolation boundary: one run's bookkeeping never stops the pool's reader
                log.exception("the end of turn %d was not handled", turn.call_id)

    def _schedule(self) -> None:
        """Hand queued turns, oldest first, to free slots (the least loaded worker first), then ahead
        (``prefetch``) to workers whose slots are all taken; with the queue empty, ask back a turn
        waiting ahead for a worker that has a free slot."""
        limit = self._turns_per_worker
        # workers passed over for the rest of this pass: their pipe refused a turn (dead, not yet seen so), or
        # the pool says they take none now (``_takes_turns``: stopped)
        refused: set[int] = set()
        if self._tokens is not None:
            self._take_from_stopped()
        if self._prefetch and self._withdraw_aged():
            # a turn asked back is older than every queued one: none overtakes it while the
            # answer is on its way (a free slot waits that round trip, ``WITHDRAW_WAIT_S`` at most)
            return
        for room in (limit, limit + self._prefetch) if self._prefetch else (limit,):
            while self._queue:
                if room > limit and self._queue[0].returned:
                    break  # it waits for a free slot, and nothing overtakes it
                worker = self._least_loaded(room, refused)
                if worker is None:
                    break
                turn = self._queue.popleft()
                turn.queued = worker.running >= limit
                if turn.queued:
                    turn.handed_at = time.monotonic()
                turn.token = self._tokens.issue() if self._tokens is not None and worker.tokens else None
                try:
                    handed = self._hand_over(worker, turn)
                except Exception as exc:  # isolation boundary: requests are checked before this; a turn no
                    # message holds (a bug) ends alone, where it ended the pool's reader and the supervisor
                    log.exception("turn %d could not be sent to a worker", turn.call_id)
                    turn.queued = False
                    self._finish(turn, TurnOutcome(stop_reason="error", diagnostic=f"the turn could not be sent to a worker: {type(exc).__name__}: {exc}"))
                    continue
                if not handed:
                    # the worker died before the pool saw it: the turn never reached it, so it
                    # stays first in line for another worker or the replacement
                    self._revoke(turn)
                    turn.queued = False
                    self._queue.appendleft(turn)
                    refused.add(worker.index)
                    continue
                turn.worker = worker
                worker.turns[turn.call_id] = turn
                if not turn.queued:
                    self._hold_budget(turn)
                    if turn.token is not None:
                        self._ask_again_later()  # whether it started, or its worker was stopped (``_take_from_stopped``)
        if self._prefetch and not self._queue:
            self._rebalance()

    def _least_loaded(self, room: int, refused: set[int]) -> W | None:
        """The live worker with the fewest running turns, if that is fewer than ``room``, of those that take turns
        now (one that does not is added to ``refused``: asked once a pass)."""
        while True:
            best, fewest = None, room
            for worker in self._slots:
                if worker is not None and worker.alive and worker.index not in refused:
                    running = worker.running
                    if running < fewest:
                        best, fewest = worker, running
            if best is None or self._takes_turns(best):
                return best
            refused.add(best.index)
            self._ask_again_later()

    def _ask_again_later(self) -> None:
        """``_schedule`` once more in ``RECHECK_S``: a worker passed over may take turns by then (one task at a time)."""
        if self._asking_again or self._tg is None or self._closing:
            return
        self._asking_again = True
        self._tg.start_soon(self._ask_again)

    async def _ask_again(self) -> None:
        try:
            await anyio.sleep(RECHECK_S)
        finally:
            self._asking_again = False
        if not self._closing:
            self._schedule()

    def _rebalance(self) -> None:
        """The queue is empty: for each free slot on a worker holding no turn ahead, ask another
        worker to give back its newest turn waiting ahead (it may have started: then nothing comes back).
        A stopped worker's free slot (``_takes_turns``) counts for none: the turn would come back to the
        worker it was asked from, behind the same running turn, with a round trip more."""
        alive = self._alive()
        if not any(t.askable for w in alive for t in w.turns.values()):
            return
        free = sum(self._free_slots(w) for w in alive if not any(t.queued for t in w.turns.values()))
        free -= sum(1 for w in alive for t in w.turns.values() if t.withdrawing)  # asked back already
        for worker in alive:
            for turn in reversed(list(worker.turns.values())):
                if free == 0:
                    return
                if turn.askable:
                    self._ask_back(worker, turn)
                    free -= 1

    def _free_slots(self, worker: W) -> int:
        """The slots a turn asked back could take on ``worker`` now: none while it takes no turns (stopped),
        and then ``_schedule`` runs again shortly, so that a turn is asked back for it once it is continued."""
        free = max(0, self._turns_per_worker - worker.running)
        if free and not self._takes_turns(worker):
            self._ask_again_later()
            return 0
        return free

    def _withdraw_aged(self) -> bool:
        """Ask back every turn that has waited ahead longer than ``AHEAD_WAIT_S`` (its worker's running
        turn is long): first in line again, it takes the next slot that frees, on any worker. Only while
        another worker takes turns (``_takers``): else the next slot that frees is the one it waits for,
        and given back it would only come to it later, a round trip more. Whether dispatch should hold
        back: a turn was asked back less than ``WITHDRAW_WAIT_S`` ago."""
        now = time.monotonic()
        asking = False
        takers: set[int] | None = None  # read once a pass, and only once a turn has aged
        for worker in self._slots:
            if worker is None or not worker.alive:
                continue
            for turn in worker.turns.values():
                if turn.askable and turn.handed_at < now - AHEAD_WAIT_S:
                    takers = self._takers() if takers is None else takers
                    if takers - {worker.index}:
                        self._ask_back(worker, turn)
                if turn.withdrawing and turn.asked_at > now - WITHDRAW_WAIT_S:
                    asking = True
                elif turn.withdrawing and turn.token is not None:
                    self._ask_again_later()  # unanswered: its worker may be stopped (``_take_from_stopped``)
        return asking

    def _take_from_stopped(self) -> None:
        """Take back, through their tokens, the turns a worker that takes no turns (stopped, ``_takes_turns``)
        has not started, while another worker takes turns: first in line again, each runs on a worker that
        takes turns (one the stopped worker took first stays: it started there, or is about to, and runs when
        it is continued). A worker read as running because it spoke less than ``QUIET_S`` ago
        (``worker_stops.py``) is looked at again shortly while a turn handed to a free slot of it has not
        started, or a withdraw waits for its answer (``_withdraw_aged``)."""
        takers: set[int] | None = None
        for worker in self._alive():
            unstarted = [turn for turn in worker.turns.values() if turn.token is not None]
            if not unstarted:
                continue
            if self._takes_turns(worker):
                if not all(turn.queued for turn in unstarted):
                    self._ask_again_later()
                continue
            takers = self._takers() if takers is None else takers
            if not takers:
                continue
            for turn in reversed(unstarted):  # each goes first in line: the oldest ends up first
                if self._revoke(turn):
                    log.info("turn %d taken back from worker %s, which is stopped", turn.call_id, worker.describe())
                    del worker.turns[turn.call_id]
                    self._withdrawn += 1
                    self._take_back(turn, returned=True)

    def _revoke(self, turn: Turn) -> bool:
        """Take ``turn`` back from the worker it was handed to, unasked: True if its worker had not
        taken its token (it never started it, and never will); its token is gone either way."""
        token, turn.token = turn.token, None
        return token is not None and self._tokens is not None and self._tokens.revoke(token)

    def _close_tokens(self) -> None:
        """At the pool's close: the tokens left (turns that ended with the pool) go, with their folder."""
        if self._tokens is not None:
            self._tokens.close()

    def _takers(self) -> set[int]:
        """The live workers that take turns now (``_takes_turns``), by index; while one does not, ``_schedule``
        runs again shortly, so that an aged turn is asked back once it is continued."""
        takers: set[int] = set()
        for worker in self._alive():
            if self._takes_turns(worker):
                takers.add(worker.index)
            else:
                self._ask_again_later()
        return takers

    def _ask_back(self, worker: W, turn: Turn) -> None:
        """Send ``Withdraw``; dispatch holds back until the answer or ``WITHDRAW_WAIT_S``, then goes on."""
        turn.withdrawing, turn.asked_at = True, time.monotonic()
        self._send_withdraw(worker, turn)
        asyncio.get_running_loop().call_later(WITHDRAW_WAIT_S, self._schedule)

    def _turn_started(self, worker: W, call_id: int) -> None:
        """The worker's ``Started``: a turn handed over ahead is running."""
        turn = worker.turns.get(call_id)
        if turn is not None:
            if turn.queued:
                self._hold_budget(turn)
            turn.queued, turn.token = False, None  # the worker took its token
            if turn.withdrawing:  # asked back too late: the turns queued behind it may go ahead again
                turn.withdrawing = False
                self._schedule()

    def _turn_withdrawn(self, worker: W, call_id: int) -> None:
        """The worker's ``Withdrawn``: the turn never started there; first in line again (or ended, if cancelled since)."""
        turn = worker.turns.pop(call_id, None)
        if turn is None:
            return
        self._withdrawn += 1
        self._take_back(turn, returned=True)
        self._schedule()

    def _take_back(self, turn: Turn, *, returned: bool) -> None:
        """A turn handed over that never started, off its worker's table: first in line again (or ended,
        if cancelled meanwhile). ``returned``: given back on request, so never handed ahead again."""
        turn.worker, turn.queued, turn.withdrawing, turn.returned, turn.token = None, False, False, returned, None
        if turn.budget_timer is not None:  # held from a free slot it never started in: held again where it starts
            turn.budget_timer.cancel()
            turn.budget_timer = None
        if turn.cancel_reason is not None:
            self._finish(turn, cancelled_before_start(turn.cancel_reason))
        else:
            self._queue.appendleft(turn)

    def _turn_done(self, turn: Turn, outcome: TurnOutcome) -> None:
        """The worker's ``TurnDone``, as its log has it: a turn that completed before its worker read a
        cancel (an interrupt, the host's ``timeout_ms``) completed, and its log, its listing and its
        result all say so (a cancel the worker took ends the turn itself: ``TurnControl``)."""
        turn.token = None  # its worker took it: the turn ran there, or ended there unstarted
        self._finish(turn, outcome)
        self._schedule()

    def _serve_rpc_soon(self, worker: W, turn: Turn | None, msg: Rpc) -> None:
        """Serve ``msg`` in a task of the pool; a wait (``BLOCKING_RPCS``) is registered first, so that a
        ``CancelRpc`` read right behind it finds it before its task has begun."""
        scope = anyio.CancelScope()
        if msg.method in BLOCKING_RPCS:
            self._waits[(id(worker), msg.rpc_id)] = scope
        assert self._tg is not None
        self._tg.start_soon(self._serve_rpc, worker, turn, msg, scope)

    def _cancel_rpc(self, worker: W, msg: CancelRpc) -> None:
        """The turn gave up waiting for ``msg.rpc_id``: its handler is cancelled (``spawn_wait`` then
        disposes the child it waited on: ``supervisor/rpc.py``); a request already answered is left."""
        scope = self._waits.get((id(worker), msg.rpc_id))
        if scope is not None:
            scope.cancel()

    async def _serve_rpc(self, worker: W, turn: Turn | None, msg: Rpc, scope: anyio.CancelScope) -> None:
        """Answer one RPC of a resident turn (``None``: a turn already gone); a waiting one parks it meanwhile.
        A wait the turn gave up (``CancelRpc``: ``scope`` cancelled) is answered with nothing."""
        blocking = msg.method in BLOCKING_RPCS and turn is not None
        if blocking:
            assert turn is not None
            turn.parked += 1
            self._schedule()
        reply: Reply | None = None
        try:
            with scope:
                reply = await self._answer(turn, msg)
        finally:
            self._waits.pop((id(worker), msg.rpc_id), None)
            if blocking:
                assert turn is not None
                turn.parked -= 1
        if reply is not None and worker.alive:
            await self._send_reply(worker, turn, reply)

    async def _answer(self, turn: Turn | None, msg: Rpc) -> Reply:
        try:
            if turn is None:
                raise RpcError.turn_gone()
            value = await turn.on_rpc(msg.method, msg.args)
            return Reply(rpc_id=msg.rpc_id, ok=True, value=value)
        except SubagentError as exc:
            return Reply(rpc_id=msg.rpc_id, ok=False, error=exc.to_wire())
        except (KeyboardInterrupt, SystemExit, anyio.get_cancelled_exc_class()):
            raise
        except BaseException as exc:  # isolation boundary: a failure serving one request goes back to its turn as an
            # error, a host hook's own BaseException too (an installer's, under ``ctx.start_continuable``)
            coded = thread_failure(exc)
            if coded is not None:  # the host's limit, not a fault of the code: one line, the public calls' code
                log.warning("rpc %s failed: %s", msg.method, coded)
                return Reply(rpc_id=msg.rpc_id, ok=False, error=coded.to_wire())
            log.exception("rpc %s failed", msg.method)
            return Reply(rpc_id=msg.rpc_id, ok=False, error=RpcError.failed(exc).to_wire())

    def _end_resident(self, worker: W, crash: str) -> None:
        """End every turn resident on a dead worker (``crash`` says how it died): ``aborted`` if its
        cancellation was asked for, else ``error``; each is marked crashed (its log needs repair).
        A turn that never started there is queued again, first in line, instead: one handed over ahead
        (no ``Started``), or one handed to a free slot whose token the worker never took (it takes it
        before it starts the turn: ``worker/claims.py``; it died stopped, or before it read the turn)."""
        unstarted = [turn for turn in worker.turns.values() if turn.queued or self._revoke(turn)]
        for turn in reversed(unstarted):
            del worker.turns[turn.call_id]
            self._revoke(turn)  # its token, left by a worker that died
            self._take_back(turn, returned=False)
        for turn in list(worker.turns.values()):
            if turn.cancel_reason == TIMEOUT:
                outcome = TurnOutcome(stop_reason="budget-exhausted", diagnostic=f"{_overran(turn)} and did not stop; {crash}")
            elif turn.cancel_reason is not None:
                outcome = TurnOutcome(stop_reason="aborted", diagnostic=f"the turn was cancelled ({turn.cancel_reason}); {crash}")
            else:
                outcome = TurnOutcome(stop_reason="error", diagnostic=crash)
            self._finish(turn, outcome, crash=crash)
        if unstarted:
            self._schedule()

    def _end_at_close(self, worker: W) -> None:
        """At close, once ``worker`` stopped: every turn still resident on it ends ``aborted``, marked
        crashed (its log may need repair) unless it was handed over ahead and never started."""
        for turn in list(worker.turns.values()):
            outcome = TurnOutcome(stop_reason="aborted", diagnostic="the supervisor closed during the turn")
            self._finish(turn, outcome, crash=None if turn.queued else outcome.diagnostic)

    def _fail_queued(self, reason: str) -> None:
        """No worker is alive to run them: every turn still queued ends ``error`` saying ``reason``, never dispatched."""
        for turn in list(self._queue):
            self._finish(turn, TurnOutcome(stop_reason="error", diagnostic=reason))
        self._queue.clear()

    def _abort_queued(self) -> None:
        """At close: every turn still queued ends ``aborted``, never dispatched."""
        for turn in list(self._queue):
            self._finish(turn, TurnOutcome(stop_reason="aborted", diagnostic="the supervisor closed before the turn ran"))
        self._queue.clear()

    # -- introspection ---------------------------------------------------------------

    def _alive(self) -> list[W]:
        return [w for w in self._slots if w is not None and w.alive]

    def statistics(self) -> PoolStatistics:
        alive = self._alive()
        ahead = sum(1 for w in alive for t in w.turns.values() if t.queued)
        return PoolStatistics(
            size=self.size,
            workers_alive=len(alive),
            queued=len(self._queue) + ahead,
            resident=sum(len(w.turns) for w in alive) - ahead,
            parked=sum(1 for w in alive for t in w.turns.values() if t.parked),
            started=self._started,
            crashed=self._crash_count,
            ahead=ahead,
            withdrawn=self._withdrawn,
        )

    def workers(self) -> list[WorkerRef]:
        """The live workers."""
        return [w.ref() for w in self._alive()]

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self._alive()]
