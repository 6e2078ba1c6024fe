"""Session creation in batches, on long-lived store threads: many children per wake-up and per commit.

Creating a child is blocking store work (folders, files, fsyncs), so it runs
in a thread. The starts queue their requests; a store thread takes
everything queued (up to ``MAX_BATCH``) and ``publish_sessions`` writes and
publishes each session. The commit that makes them durable as a set (one
fsync of ``sessions/``, one index append per parent: ``commit_sessions``)
is a group commit across the threads: the first to finish publishing
commits everything published by then, and one that finishes while a commit
runs hands its sessions to the next commit and waits for it.

The fsyncs of a batch's files are issued at once, on the threads of a
``ConcurrentSync`` the creator owns (``store/concurrent_sync.py``): the disk
serves them together, where one after another each waited for the last.

Why threads of our own rather than ``anyio.to_thread`` per batch: starts
arrive one by one (each as an earlier child finishes), so a drain task that
took "everything queued" into a thread hop usually took one session — 1.4
per commit measured with 32 starts in flight — and paid a hop (a thread
wake-up and a GIL hand-off, 50–118 µs of CPU) for each. A store thread that
is busy takes what queued up meanwhile without being woken
(``statistics()`` counts batches and commits; ``benchmarks/one_shot.py``
prints them).

Each request still succeeds or fails on its own and is as durable as with
``create_session`` when its ``create`` returns: its file, its name in
``sessions/`` and its index entry are on disk. A creation that
started always finishes (the waiting start is shielded from cancellation),
and its caller decides whether to keep or roll back the session
(``supervisor/oneshot.py``).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import anyio

from subagents.store import Store
from subagents.store.concurrent_sync import ConcurrentSync
from subagents.store.session import CreatedSession, NewSession, commit_sessions, publish_sessions

from .errors import SupervisorClosedError, ThreadStartError

__all__ = ["SessionCreator", "CreatorStatistics"]

# Two store threads: a second one publishes while the first waits for its fsyncs (the
# disk serves them in parallel), and few enough that the event loop is not out-voted
# for the GIL; a thread is only started or woken when more is queued than the awake
# threads will take when their batches end.
DEFAULT_THREADS = 2
# A bound on one hop's work, so one drain does not hold many starts behind a long batch.
MAX_BATCH = 32

Outcome = CreatedSession | BaseException


@dataclass(frozen=True)
class CreatorStatistics:
    sessions: int  # created (published and committed)
    hops: int  # batches the store threads took from the queue
    queued: int  # requests waiting for a store thread now
    commits: int  # group commits: fsyncs of ``sessions/`` (under a syncing policy)

    @property
    def sessions_per_commit(self) -> float:
        return self.sessions / self.commits if self.commits else 0.0


@dataclass(eq=False)
class _Slot:
    request: NewSession
    outcome: asyncio.Future[Outcome]  # set on the event loop by ``_deliver``


@dataclass(eq=False)
class _Published:
    """One drain's published batch, waiting for a group commit (owned by ``_GroupCommit``)."""

    requests: list[NewSession]
    outcomes: list[Outcome]
    committed: bool = False


class _GroupCommit:
    """Commits what several drain threads published, one commit at a time, all waiting ones together."""

    def __init__(self, store: Store, syncs: ConcurrentSync | None = None) -> None:
        self._store = store
        self._syncs = syncs
        self._cond = threading.Condition()
        self._waiting: list[_Published] = []
        self._committing = False
        self.sessions = 0
        self.commits = 0

    def waiting(self) -> int:
        """How many published batches wait for the next commit."""
        with self._cond:
            return len(self._waiting)

    def create(self, requests: list[NewSession]) -> list[Outcome]:
        """Publish ``requests``, then return once a group commit has covered them (runs in a drain thread)."""
        mine = _Published(requests, list(publish_sessions(self._store, requests, syncs=self._syncs)))
        if all(isinstance(o, BaseException) for o in mine.outcomes):
            return mine.outcomes
        with self._cond:
            self._waiting.append(mine)
            while not mine.committed and self._committing:
                self._cond.wait()
            if mine.committed:
                return mine.outcomes
            self._committing = True
            group, self._waiting = self._waiting, []
        try:
            self._commit(group)
        finally:
            with self._cond:
                self._committing = False
                for member in group:
                    member.committed = True
                self._cond.notify_all()
        return mine.outcomes

    def _commit(self, group: list[_Published]) -> None:
        requests = [r for member in group for r in member.requests]
        outcomes = [o for member in group for o in member.outcomes]
        try:
            committed = commit_sessions(self._store, requests, outcomes)
        except BaseException as exc:  # commit_sessions rolled back every session of the group
            committed = [o if isinstance(o, BaseException) else exc for o in outcomes]
            self._split(group, committed)
            raise
        self._split(group, committed)
        self.commits += 1
        self.sessions += sum(1 for o in committed if not isinstance(o, BaseException))

    @staticmethod
    def _split(group: list[_Published], committed: list[Outcome]) -> None:
        at = 0
        for member in group:
            member.outcomes = committed[at : at + len(member.outcomes)]
            at += len(member.outcomes)


class SessionCreator:
    """Creates sessions for the event loop on long-lived store threads, in batches.

    The event loop only queues a request and, when a store thread is asleep
    and none is already being woken, wakes one; a thread that is busy takes
    everything queued when it finishes its batch, so under load no wake-up
    (and no thread hop) is paid per start. A finished batch comes back to the
    loop in one ``call_soon_threadsafe``. Runs on asyncio (as the supervisor's
    pools do); the threads stop at ``aclose`` after finishing what is queued.
    """

    def __init__(self, store: Store, *, threads: int = DEFAULT_THREADS) -> None:
        # the fsyncs of a batch's files, issued at once (the disk serves them together)
        self._syncs = ConcurrentSync()
        self._group = _GroupCommit(store, self._syncs)
        self._max_threads = threads
        self._cond = threading.Condition()
        # under ``_cond``: the queue, the threads, and how many sleep / are being woken
        self._pending: list[_Slot] = []
        self._threads: list[threading.Thread] = []
        self._sleeping = 0
        self._waking = 0
        self._closing = False
        self._hops = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    async def create(self, request: NewSession) -> CreatedSession:
        """Create one session (durably, under the store's policy); raises what stopped it.

        The caller shields the wait from cancellation (``OneShotRuns._create``): a creation that
        started always finishes, and only its caller can roll the session back.
        """
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        slot = _Slot(request, self._loop.create_future())
        with self._cond:
            if self._closing:
                raise SupervisorClosedError()
            self._pending.append(slot)
            if len(self._pending) <= self._busy():
                pass  # a thread at work takes it when its batch ends: no wake-up, a bigger batch
            elif self._sleeping > self._waking:
                self._waking += 1
                self._cond.notify()
            elif len(self._threads) < self._max_threads:
                thread = threading.Thread(target=self._serve, name=f"subagents-creator-{len(self._threads)}", daemon=True)
                try:
                    thread.start()
                except RuntimeError as exc:  # can't start new thread: counted as one, it left the queue to nobody
                    if not self._threads:
                        self._pending.remove(slot)
                        raise ThreadStartError("session creation", exc) from None
                    # the threads at work take it when their batches end
                else:
                    self._threads.append(thread)
        outcome = await slot.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def statistics(self) -> CreatorStatistics:
        with self._cond:
            return CreatorStatistics(sessions=self._group.sessions, hops=self._hops, queued=len(self._pending), commits=self._group.commits)

    async def aclose(self) -> None:
        """Stop the store threads once they have created everything queued; later ``create`` calls raise."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            threads = list(self._threads)
        for thread in threads:
            await anyio.to_thread.run_sync(thread.join)
        await anyio.to_thread.run_sync(self._syncs.close)

    def _busy(self) -> int:
        # threads awake (working, or woken and about to take the queue); called under ``_cond``
        return len(self._threads) - self._sleeping + self._waking

    def _serve(self) -> None:
        """A store thread: take everything queued (up to ``MAX_BATCH``), create it, hand it back; sleep when idle."""
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._sleeping += 1
                    self._cond.wait()
                    self._sleeping -= 1
                    if self._waking:
                        self._waking -= 1
                if not self._pending:
                    return  # closing, nothing left
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                self._hops += 1
            try:
                outcomes: list[Outcome] = self._group.create([s.request for s in batch])
            except BaseException as exc:  # every request the batch carried fails with it, never lost with the thread
                outcomes = [exc] * len(batch)
            assert self._loop is not None
            self._loop.call_soon_threadsafe(_deliver, batch, outcomes)


def _deliver(batch: list[_Slot], outcomes: list[Outcome]) -> None:
    """On the event loop: each waiting ``create`` gets its outcome."""
    for slot, outcome in zip(batch, outcomes):
        if not slot.outcome.done():  # cancelled only if a caller did not shield its wait
            slot.outcome.set_result(outcome)
