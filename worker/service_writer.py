"""The worker's end of the store service: a ``SessionWriter`` whose appends travel to the store's host.

``ServiceSessions`` is the ``SessionAccess`` of a worker that cannot reach the
store's disk (a Ray worker on another node); ``ServiceWriter`` is its writer.
``call(method, **kwargs)`` carries one request to ``StoreService``
(``worker/store_service.py``) and returns its reply; over Ray it is an actor
call, in tests it can be the service itself.

Ordering: a cluster may run the calls of one client in any order (Ray's async
actors do), so the writer keeps **one append in flight** and sends each
batch with its ``first_seq``; the service refuses any other seq
(``SeqMismatchError``), so a reordered or replayed batch can never land out
of place. Appends made while a batch is in flight queue up and go out
**coalesced** in the next call, which amortises the round trip. ``append``
itself only queues (it returns the records it will write, ``ts`` still
unset: the store's host stamps them); a sender thread owned by the writer
does the calls. ``flush()`` awaits everything queued: the turn calls it
before a tool runs (``tool/call`` is write-ahead), at commit points, around
a report and at the turn's end. A failed batch (``FencedError``, a dead
service) is raised by the next ``append`` or ``flush``; what was queued
behind it is dropped, so the log stays a prefix of what the turn wrote.

A full disk is the local writer's verdict too, only later: the store cuts a
batch it had no room for back whole and its writer goes on (``NoRoomError``,
``DURABILITY_FAILED``), so this writer does not break on it. A coalesced
batch refused so is sent again append by append, in order, until the first
one refused: what fits lands, as the local writer appending them one by one
would have written it (a turn's ``turn/start`` coalesced with a flood of
output is kept, and the child is not listed ``not-started`` after it ran).
That append and everything queued behind it are dropped, the refusal is
raised once, by the next ``append`` or ``flush``, and the writer then takes
appends again at the log's next seq: the turn can still close with the
error (``worker/turn.py``), as on the local pool, instead of leaving an open
turn that lists as a host crash.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from typing import Any, Callable, Sequence

from subagents.store.errors import NoRoomError, SubagentError, UnsupportedFormatError, from_wire
from subagents.store.events import EVENT_TYPES
from subagents.store.framing import MAX_RECORD_BYTES, encode_record

from .sessions import attachable
from .store_service import join_events, pack_event

__all__ = ["ServiceCall", "ServiceSessions", "ServiceWriter", "StoreServiceError"]

log = logging.getLogger(__name__)

ServiceCall = Callable[..., dict[str, Any]]

# how much of a transport failure's text a diagnostic keeps
_CAUSE_MAX = 300
# more than a record's envelope (seq, ts, type, epoch) adds to its packed data: below this, no record
# can reach the store's limit, and nothing but a length comparison is paid
_ENVELOPE_BYTES = 256


class StoreServiceError(SubagentError, ConnectionError):
    """Raised when the store service cannot be reached or died under a call."""

    code = "STORE_SERVICE_FAILED"


def _checked(reply: dict[str, Any]) -> dict[str, Any]:
    if "error" in reply:
        raise from_wire(reply["error"])
    return reply


def _call(call: ServiceCall, method: str, **kwargs: Any) -> dict[str, Any]:
    try:
        reply = call(method, **kwargs)
    except SubagentError:
        raise
    except Exception as exc:  # the transport's own failure (actor died, node lost): one typed error
        # one line: Ray's text of a dead actor runs over many (the pool's statistics count the service's deaths)
        said = " ".join(f"{type(exc).__name__}: {exc}".split())[:_CAUSE_MAX]
        raise StoreServiceError(f"the store service failed during {method}: {said}", method=method) from exc
    return _checked(reply)


class ServiceWriter:
    """An open, fenced writer of one session, appending through the store service."""

    def __init__(
        self, call: ServiceCall, session_id: str, epoch: int, writer_id: str, next_seq: int, *, opening: dict[str, Any] | None = None,
        max_record_bytes: int = MAX_RECORD_BYTES,
    ) -> None:
        self.session_id = session_id
        self.epoch = epoch
        self._call = call
        self._limit = max_record_bytes  # the store's: a record above it is refused at ``append``
        self._writer_id = writer_id
        # not yet open on the service: the first batch carries this and opens it (one round trip, not two)
        self._opening = opening
        self._cond = threading.Condition()
        # appended, not yet sent: per append its events (each packed) and whether it is a commit point;
        # kept apart so that a batch refused for want of room can be sent again append by append
        self._queue: list[tuple[list[bytes], bool]] = []
        self._in_flight = False
        self._sent_seq = next_seq  # the log's next seq after every acknowledged batch
        self._queued_seq = next_seq  # ... after everything appended
        self._error: SubagentError | None = None
        self._closing = False
        self._closed_on_service = False
        self._idle_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self.batches_sent = 0
        self._sender = threading.Thread(target=self._send_loop, name=f"store-writer-{session_id}", daemon=True)
        self._sender.start()

    @property
    def next_seq(self) -> int:
        return self._queued_seq

    @property
    def max_record_bytes(self) -> int:
        """The store's record limit, as the service told this worker (``StoreService.ping``)."""
        return self._limit

    def append(self, batch: Sequence[tuple[str, Any]], *, commit: bool = False) -> list[dict[str, Any]]:
        """Queue ``(type, data)`` events (one in flight, the rest coalesced); raises an earlier batch's failure."""
        for kind, _ in batch:
            if kind not in EVENT_TYPES:
                raise UnsupportedFormatError(f'event type "{kind}" is not one this store writes', event_type=kind)
        packed = [pack_event(kind, data) for kind, data in batch]  # once; refuses what msgpack cannot carry now
        with self._cond:
            self._raise_failure()
            if self._closing:
                raise SubagentError(f'writer of session "{self.session_id}" is closed', code="WRITER_CLOSED")
            seq = self._queued_seq
            for i, ((kind, data), one) in enumerate(zip(batch, packed)):
                if len(one) + _ENVELOPE_BYTES > self._limit:
                    # refused here, as a local writer refuses it: the service would refuse the whole coalesced
                    # batch, and the writer, broken, would take not even the turn's closing ``turn/end``
                    self._check_size(seq + i, kind, data)
            records = [{"seq": seq + i, "ts": None, "type": kind, "data": data, "epoch": self.epoch} for i, (kind, data) in enumerate(batch)]
            self._queue.append((packed, commit))
            self._queued_seq += len(batch)
            self._cond.notify_all()
        return records

    def _check_size(self, seq: int, kind: str, data: Any) -> None:
        """``RecordTooLargeError`` for the record the store would write, framed as it frames it: the seq it
        gets (appends are queued in seq order and never renumbered: a batch dropped for want of room is
        not sent again), this writer's epoch, and ``ts`` a float, which msgpack packs in 9 bytes whatever
        the host stamps. The same verdict and size as the local writer's, not a bound: seq and epoch at
        their widest refused records 16 bytes short of the limit, naming a size no record had."""
        encode_record({"seq": seq, "ts": 0.0, "type": kind, "data": data, "epoch": self.epoch}, limit=self._limit, what=f'a "{kind}" event',
                      event=kind)

    def _raise_failure(self) -> None:
        """Raise a failed batch's error, under the condition. A refusal for want of room is raised once: the
        writer goes on after it, as a local one does (the module's docstring); any other failure, for good."""
        error = self._error
        if error is None:
            return
        if isinstance(error, NoRoomError):
            self._error = None
        raise error

    async def flush(self) -> None:
        """Return once every queued append is acknowledged by the store's host (durable at a commit point).

        The sender thread wakes the waiting loop with ``call_soon_threadsafe``
        (no thread-pool hop: the worker's loop is asyncio, as Ray's actors are).
        """
        loop = asyncio.get_running_loop()
        with self._cond:
            self._raise_failure()
            if not self._queue and not self._in_flight:
                return
            idle: asyncio.Future[None] = loop.create_future()
            self._idle_waiters.append((loop, idle))
        await idle
        with self._cond:
            self._raise_failure()

    def _wake_idle_waiters(self) -> None:
        """Called by the sender under the condition when nothing is queued or in flight, or on failure."""
        waiters, self._idle_waiters = self._idle_waiters, []
        for loop, idle in waiters:
            loop.call_soon_threadsafe(_resolve, idle)

    def _send_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                groups, self._queue = self._queue, []
                self._in_flight = True
                first_seq = self._sent_seq
            next_seq, error = self._send(first_seq, groups)
            if isinstance(error, NoRoomError) and len(groups) > 1:
                # the store cut the batch back whole: again append by append, what fits lands (the module's docstring)
                next_seq, error = first_seq, None
                for group in groups:
                    next_seq, error = self._send(next_seq, [group])
                    if error is not None:
                        break
            with self._cond:
                self._in_flight = False
                self._sent_seq = next_seq
                if error is not None:
                    self._error = error
                    self._queue.clear()  # never send past a failed batch: the log stays a prefix
                    self._queued_seq = next_seq  # the log's next seq: where a writer that goes on appends
                if error is not None or not self._queue:
                    self._wake_idle_waiters()
                self._cond.notify_all()
                if error is not None and not isinstance(error, NoRoomError):
                    return

    def _send(self, first_seq: int, groups: list[tuple[list[bytes], bool]]) -> tuple[int, SubagentError | None]:
        """One append call of ``groups`` coalesced at ``first_seq``: the log's next seq after it, and its error."""
        opening = {"opening": self._opening} if self._opening is not None else {}
        events = [one for packed, _ in groups for one in packed]
        commit = any(commit for _, commit in groups)
        try:
            reply = _call(self._call, "append", writer_id=self._writer_id, first_seq=first_seq, events=join_events(events), commit=commit,
                          **opening)
        except SubagentError as exc:
            return first_seq, exc
        finally:
            with self._cond:
                self.batches_sent += 1
        self._opening = None  # only the sender thread reads or clears it
        return int(reply["next_seq"]), None

    def release_lease(self, owner: str) -> None:
        """Release ``owner``'s lease and close this writer on the service, in one call.

        A one-shot turn's last act on its log, after ``flush`` (its closing
        commit is acknowledged): the writer takes no append after it, and
        ``close`` has nothing left to send. ``FencedError`` when the lease moved
        on (nothing written); the service's writer is closed either way. A
        writer that never sent a batch (never opened there) releases alone.
        """
        self._stop_sender()
        if not self._on_service():
            _call(self._call, "release_lease", session_id=self.session_id, owner=owner, epoch=self.epoch)
            return
        self._closed_on_service = True
        _call(self._call, "close_writer", writer_id=self._writer_id, release_owner=owner)

    def close(self) -> None:
        """Send what is still queued, stop the sender, close the service's writer (best effort)."""
        self._stop_sender()
        if self._closed_on_service or not self._on_service():
            return  # closed by the release, or never opened on the service: nothing to close there
        self._closed_on_service = True
        if isinstance(self._error, StoreServiceError):
            # a batch's call already failed or timed out: waiting as long again for the close (the turn
            # waited 2 × the call timeout on a hung store host) is left to a thread, for a service that
            # comes back and would otherwise keep the writer open
            threading.Thread(target=self._close_on_service, name=f"store-writer-close-{self.session_id}", daemon=True).start()
            return
        self._close_on_service()

    def _close_on_service(self) -> None:
        try:
            _call(self._call, "close_writer", writer_id=self._writer_id)
        except SubagentError:
            log.warning("closing the remote writer of %s failed", self.session_id, exc_info=True)

    def _stop_sender(self) -> None:
        """Let the sender send what is queued, then stop it; the writer takes no more appends."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._sender.join()

    def _on_service(self) -> bool:
        """Whether the service has this writer open (a batch went out: the first opens it, even if it failed)."""
        return self._opening is None or self.batches_sent > 0


def _resolve(idle: "asyncio.Future[None]") -> None:
    if not idle.done():
        idle.set_result(None)


class ServiceSessions:
    """``SessionAccess`` through the store service (a worker on a host without the store's disk)."""

    remote = True  # every call is a round trip that blocks its caller

    def __init__(self, call: ServiceCall, *, max_record_bytes: int = MAX_RECORD_BYTES) -> None:
        self._call = call
        self._max_record_bytes = max_record_bytes  # the store's (``StoreService.ping``), which its writers refuse above

    def open_writer(self, session_id: str, *, epoch: int, log_state: dict[str, Any] | None = None) -> ServiceWriter:
        """With a usable ``log_state`` (a session its supervisor just created), no call: the first batch
        opens the writer on the store's host, attached to that state, and is fenced there as any append.
        Otherwise one round trip opens (and repairs) the log before the turn begins."""
        writer_id = uuid.uuid4().hex
        state = attachable(log_state)
        if state is not None:
            opening = {"session_id": session_id, "epoch": epoch, "log_state": log_state}
            return ServiceWriter(self._call, session_id, epoch, writer_id, state[1].next_seq, opening=opening,
                                 max_record_bytes=self._max_record_bytes)
        reply = _call(self._call, "open_writer", writer_id=writer_id, session_id=session_id, epoch=epoch)
        return ServiceWriter(self._call, session_id, epoch, writer_id, int(reply["next_seq"]), max_record_bytes=self._max_record_bytes)

    def history(self, session_id: str) -> list[dict[str, Any]]:
        return list(_call(self._call, "history", session_id=session_id)["events"])

