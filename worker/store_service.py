"""``StoreService``: the store's host serving the appends of turns that run on other hosts.

One instance runs on the host whose disk holds the store (as a Ray actor
pinned there by a custom resource only that host advertises; the supervisor
starts it, ``supervisor/ray_pool.py``). It opens each remote turn's log with
the writer a local turn would have (``LocalSessions``: the store's own
``LogWriter``), so the fence check stays at the resource, under the same
session ``flock`` as a local append, a torn tail or an open turn is repaired
exactly as on the local resume path, and a release is the local turn's.

Placement: the service and its client (``worker/service_writer.py``) live in
``worker/`` because they are the two ends of the worker's append path and
share its contract; the service imports only ``store`` and ``worker/sessions.py`` (never Ray, never the
supervisor), so it runs and is tested without a cluster, and the supervisor,
which may import ``worker``, wraps it into an actor. ``store/`` stays free of
any transport.

A remote writer's calls cross as msgpack bytes (``call``: one ``bytes`` in,
one out). Every call returns plain data: a failure is ``{"error":
SubagentError.to_wire()}`` and the client rebuilds the same class
(``FencedError``, ``SeqMismatchError``...).
Calls on one writer run one at a time (the client keeps one in flight anyway;
a second concurrent one, e.g. a zombie's retry, waits and then meets the
seq or fence check). Appends that fsync (``strict``, or a commit point) run
in the service's threads, so one slow fsync does not hold the other
sessions' appends (a caller cancelled meanwhile still waits for its write); a
plain write runs on the loop (cheaper than the hop). A session's flock is
only ever held for a write, so waiting for it on the loop is brief.

Not guaranteed: a writer whose client vanished (its node died) stays open
until the supervisor fences the session and someone calls ``close_writer``,
or the service stops; it can never write again once fenced.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import anyio
import msgpack

from subagents.store import Store, SubagentError, release_lease

from .sessions import LocalSessions, LocalWriter, attachable

__all__ = ["StoreService", "decode_reply", "encode_request", "join_events", "pack_event", "pack_events", "unpack_events"]

log = logging.getLogger(__name__)

Reply = dict[str, Any]

# what a remote writer may ask through ``StoreService.call``
_CALLS = frozenset({"open_writer", "append", "close_writer", "history", "release_lease"})
# threads for the store work that may block (fsyncs, opens, reads): as many sessions fsync at once
# (the file system may commit their journal entries together); more would only queue on the disk
_STORE_THREADS = 16

T = TypeVar("T")


def encode_request(method: str, fields: dict[str, Any]) -> bytes:
    """One call to the service as msgpack bytes: Ray then carries one opaque ``bytes`` each way
    instead of pickling every argument and the reply (~0.2 ms of a ~1.5 ms round trip here)."""
    return msgpack.packb([method, fields], use_bin_type=True)


def decode_reply(raw: bytes) -> Reply:
    reply: Reply = msgpack.unpackb(raw, raw=False)
    return reply


def pack_event(kind: str, data: Any) -> bytes:
    """One ``(type, data)`` event as msgpack (raises for what msgpack cannot carry)."""
    return msgpack.packb([kind, data], use_bin_type=True)


def join_events(packed: list[bytes]) -> bytes:
    """Events packed one by one (``pack_event``) as one batch, the bytes ``pack_events`` makes: a writer
    packs each event once, when it is appended, however the events are then coalesced."""
    return msgpack.Packer().pack_array_header(len(packed)) + b"".join(packed)


def pack_events(batch: list[tuple[str, Any]]) -> bytes:
    """A batch of ``(type, data)`` as msgpack bytes, as it crosses the wire."""
    return join_events([pack_event(kind, data) for kind, data in batch])


def unpack_events(raw: bytes) -> list[tuple[str, Any]]:
    return [(kind, data) for kind, data in msgpack.unpackb(raw, raw=False)]


@dataclass(eq=False)
class _OpenWriter:
    writer: LocalWriter
    lock: anyio.Lock = field(default_factory=anyio.Lock)


class StoreService:
    """Appends, history and lease release for turns whose worker cannot reach the store's disk."""

    def __init__(self, store_root: str, durability: str) -> None:
        self._store = Store(store_root, durability=durability, create=False)
        # the local turn's own access to the store: a remote turn's writer is the writer a local turn would have
        self._sessions = LocalSessions(self._store)
        self._writers: dict[str, _OpenWriter] = {}
        # the service's own threads, not anyio's: a hop through a plain executor costs ~0.3 ms less here
        self._threads = ThreadPoolExecutor(_STORE_THREADS, thread_name_prefix="store-service")
        self._in_threads = 0  # works submitted to the threads, not over yet

    async def ping(self) -> Reply:
        """The store this service serves (a readiness probe), with its record limit, which the pool hands
        its workers: a remote writer refuses a record above it as a local one does, at ``append``."""
        return {"store_root": self._store.root, "durability": self._store.durability.name, "pid": os.getpid(),
                "max_record_bytes": self._store.max_record_bytes}

    async def watch(self) -> None:
        """Never returns: the pool keeps one call pending, and the service's death fails it."""
        await asyncio.Event().wait()

    async def call(self, request: bytes) -> bytes:
        """A remote writer's request (``encode_request``) served, its reply packed (``decode_reply``)."""
        method, fields = msgpack.unpackb(request, raw=False)
        if method not in _CALLS:
            raise ValueError(f"the store service has no call {method!r}")  # a client of another version: a bug, not a store error
        reply: Reply = await getattr(self, method)(**fields)
        return msgpack.packb(reply, use_bin_type=True)

    async def open_writer(self, writer_id: str, session_id: str, epoch: int) -> Reply:
        """Open (and repair, as the resume path does) a session's log for one remote turn."""
        if writer_id in self._writers:
            return _error(SubagentError(f"writer {writer_id} is already open", code="WRITER_EXISTS", writer_id=writer_id))
        try:
            writer = await self._off_loop(lambda: self._sessions.open_writer(session_id, epoch=epoch))
        except SubagentError as exc:
            return _error(exc)
        self._writers[writer_id] = _OpenWriter(writer)
        return {"next_seq": writer.next_seq}

    async def _attach(self, writer_id: str, opening: dict[str, Any]) -> _OpenWriter:
        """The writer a first append opens: attached to the log its creator left (``TurnSpec.log_state``),
        read nothing at open; its first append takes the lock and checks the fence as any other."""
        log_state = opening.get("log_state")
        if attachable(log_state) is None:
            raise SubagentError(f"writer {writer_id} was asked to open without a usable log state", code="WRITER_CLOSED", writer_id=writer_id)
        writer = await self._off_loop(
            lambda: self._sessions.open_writer(str(opening["session_id"]), epoch=int(opening["epoch"]), log_state=log_state)
        )
        if writer_id in self._writers:  # a replayed first batch opened it meanwhile: one writer per id
            writer.close()
            return self._writers[writer_id]
        entry = self._writers[writer_id] = _OpenWriter(writer)
        return entry

    async def append(self, writer_id: str, first_seq: int, events: bytes, commit: bool, opening: dict[str, Any] | None = None) -> Reply:
        """Append one batch at ``first_seq`` (else ``SEQ_MISMATCH``, nothing written); fenced under the session lock.

        ``opening`` (``{session_id, epoch, log_state}``) on a writer's first batch opens it here: one
        round trip instead of two for a turn whose creator handed it the log's state."""
        entry = self._writers.get(writer_id)
        if entry is None and opening is not None:
            try:
                entry = await self._attach(writer_id, opening)
            except SubagentError as exc:
                return _error(exc)
        if entry is None:
            return _error(SubagentError(f"writer {writer_id} is not open", code="WRITER_CLOSED", writer_id=writer_id))
        batch = unpack_events(events)
        async with entry.lock:
            try:
                if commit or self._store.durability.name == "strict":
                    # an fsync may take milliseconds: off the loop, so other sessions' appends go on
                    await self._off_loop(lambda: entry.writer.append(batch, first_seq=first_seq, commit=commit))
                else:
                    # a plain write (lock, fence check, write: ~0.1 ms) costs less than a thread hop
                    entry.writer.append(batch, first_seq=first_seq)
            except SubagentError as exc:
                return _error(exc)
            return {"next_seq": entry.writer.next_seq}

    async def close_writer(self, writer_id: str, release_owner: str | None = None) -> Reply:
        """Close a remote turn's writer; with ``release_owner``, first release that owner's lease through it.

        The release is a one-shot turn's last act on its log, after its closing
        commit, and the close follows it at once: one call for both. It is the
        local turn's release (``LocalWriter.release_lease``): fenced under the
        session lock, ``FencedError`` (nothing written) when the lease moved on.
        The writer is closed either way. Not durable, as any release.
        """
        entry = self._writers.pop(writer_id, None)
        if entry is None:
            if release_owner is not None:
                return _error(SubagentError(f"writer {writer_id} is not open: nothing to release through", code="WRITER_CLOSED", writer_id=writer_id))
            return {}
        async with entry.lock:
            try:
                if release_owner is not None:
                    # a lock, a pread and a pwrite of a lease slot, no fsync: on the loop, as a plain append
                    entry.writer.release_lease(release_owner)
            except SubagentError as exc:
                return _error(exc)
            finally:
                entry.writer.close()
        return {}

    async def history(self, session_id: str) -> Reply:
        """The valid prefix of a session's log, read-only (``ctx.history()``)."""
        try:
            events = await self._off_loop(lambda: self._sessions.history(session_id))
        except SubagentError as exc:
            return _error(exc)
        return {"events": events}

    async def release_lease(self, session_id: str, owner: str, epoch: int) -> Reply:
        """Release a lease without a writer (a turn whose writer never reached this service)."""
        try:
            await self._off_loop(lambda: release_lease(self._store, session_id, owner, epoch))
        except SubagentError as exc:
            return _error(exc)
        return {}

    async def _off_loop(self, work: Callable[[], T]) -> T:
        """``work`` in the service's threads. A caller cancelled meanwhile still waits for it to end: the
        writer's lock stays held until its write is over (a ``LogWriter`` is not thread-safe)."""
        future = asyncio.get_running_loop().run_in_executor(self._threads, work)
        self._in_threads += 1
        future.add_done_callback(self._thread_done)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            await asyncio.wait({future})
            raise

    def _thread_done(self, _future: "asyncio.Future[Any]") -> None:
        self._in_threads -= 1

    def close(self) -> None:
        """Stop the threads, then close every writer (an actor's process ends with them anyway)."""
        self._threads.shutdown(wait=True)
        for entry in self._writers.values():
            entry.writer.close()
        self._writers.clear()
        self._sessions.close()

    def statistics(self) -> Reply:
        return {"open_writers": len(self._writers), "in_threads": self._in_threads}


def _error(exc: SubagentError) -> Reply:
    return {"error": exc.to_wire()}
