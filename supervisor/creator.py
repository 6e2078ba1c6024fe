"""Session creation in batches: many children's creations per thread hop, and per commit.

Creating a child is blocking store work (folders, files, fsyncs), so it runs
in a thread. The starts queue their requests; at most ``threads`` drain
tasks each take everything queued so far into one thread hop, where
``publish_sessions`` writes and publishes each session. The commit that
makes them durable as a set (one fsync of ``sessions/``, one index append
per parent: ``commit_sessions``) is a group commit across the drains: the
first drain thread to finish publishing commits everything published by
then, and a drain that finishes while a commit runs hands its sessions to
the next one and waits for it. Starts arrive one by one (each as an earlier
child finishes), so a drain's own batch is often a single session; the
commit is where they meet — measured with 32 starts in flight on 2 cores:
1.4 sessions per commit when each drain committed alone, several now
(``statistics()``; ``benchmarks/one_shot.py`` prints it).

Each request still succeeds or fails on its own and is as durable as with
``create_session`` when its ``create`` returns: its header, its folder's
name in ``sessions/`` and its index entry are on disk. A drain is shielded
from cancellation: a creation that started always finishes, and its caller
decides whether to keep or roll back the session (``supervisor/oneshot.py``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import anyio

from subagents.store import Store
from subagents.store.session import CreatedSession, NewSession, commit_sessions, publish_sessions

__all__ = ["SessionCreator", "CreatorStatistics"]

# Enough drains to keep several fsyncs in flight (the disk serves them in parallel),
# few enough that the event loop is not out-voted for the GIL by store threads.
DEFAULT_THREADS = 4
# A bound on one hop's work, so one drain does not hold many starts behind a long batch.
MAX_BATCH = 32

Outcome = CreatedSession | BaseException


@dataclass(frozen=True)
class CreatorStatistics:
    sessions: int  # created (published and committed)
    hops: int  # thread hops (drain batches)
    commits: int  # group commits: fsyncs of ``sessions/`` (under a syncing policy)

    @property
    def sessions_per_commit(self) -> float:
        return self.sessions / self.commits if self.commits else 0.0


@dataclass(eq=False)
class _Slot:
    request: NewSession
    done: anyio.Event = field(default_factory=anyio.Event)
    outcome: Outcome | None = None


@dataclass(eq=False)
class _Published:
    """One drain's published batch, waiting for a group commit (owned by ``_GroupCommit``)."""

    requests: list[NewSession]
    outcomes: list[Outcome]
    committed: bool = False


class _GroupCommit:
    """Commits what several drain threads published, one commit at a time, all waiting ones together."""

    def __init__(self, store: Store) -> None:
        self._store = store
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
        mine = _Published(requests, list(publish_sessions(self._store, requests)))
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
    """Creates sessions for the event loop, batching concurrent requests into few thread hops and commits."""

    def __init__(self, store: Store, tg: anyio.abc.TaskGroup, *, threads: int = DEFAULT_THREADS) -> None:
        self._store = store
        self._tg = tg
        self._threads = threads
        self._pending: list[_Slot] = []
        self._draining = 0
        self._group = _GroupCommit(store)
        self._hops = 0

    async def create(self, request: NewSession) -> CreatedSession:
        """Create one session (durably, under the store's policy); raises what stopped it."""
        slot = _Slot(request)
        self._pending.append(slot)
        if self._draining < self._threads:
            self._draining += 1
            self._tg.start_soon(self._drain)
        with anyio.CancelScope(shield=True):
            await slot.done.wait()
        assert slot.outcome is not None
        if isinstance(slot.outcome, BaseException):
            raise slot.outcome
        return slot.outcome

    def statistics(self) -> CreatorStatistics:
        return CreatorStatistics(sessions=self._group.sessions, hops=self._hops, commits=self._group.commits)

    async def _drain(self) -> None:
        try:
            with anyio.CancelScope(shield=True):
                while self._pending:
                    batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                    self._hops += 1
                    try:
                        outcomes = await anyio.to_thread.run_sync(self._group.create, [s.request for s in batch])
                    except Exception as exc:  # the hop itself failed: every request it carried fails with it
                        outcomes = [exc] * len(batch)
                    for slot, outcome in zip(batch, outcomes):
                        slot.outcome = outcome
                        slot.done.set()
        finally:
            self._draining -= 1
