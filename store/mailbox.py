"""Durable mailboxes: messages accepted for a session and not yet taken into a turn.

``accept`` appends a framed record ``{seq, id, ts, source, content}`` to
``sessions/<id>.mailbox`` under the session lock and fsyncs it (unless the
policy is ``none``) before it returns the message id: an accepted message
survives a crash of every process. The mailbox is padded like a session log
(FORMAT.md §8): the acceptance that extends it pads it with zeros to the next
4 KiB boundary, the next ones overwrite those zeros in place, so their fsync
writes the message and no size change. ``mailbox_data_end`` is where its data
ends: what a watcher compares, since an acceptance need not change its size.

Consumption is recorded in the *log*, not here: the turn that takes a message
appends ``message/accepted`` (or teardown appends ``message/discarded``) with
its id. Messages are consumed in FIFO order, so the log's consumed count
(kept in the projection) is the length of the consumed prefix of the mailbox;
``pending`` checks that the last consumed id matches before trusting it.
Recovery therefore delivers each accepted message exactly once.

Readers (``store/mailbox_read.py``) check every record (``store/records.py``): a record of the wrong
shape is damage, and ends the valid prefix like a bad CRC — writers use the
same check, so they never append after damage a reader would stop at. Every
record is an acknowledged message, so damage is read by the log's rule with
every record a commit point (``framing.torn_tail``, FORMAT.md §3.3): only a
provable torn tail (the cut-short last frame of an acceptance that never
returned, then zeros or the file's end) is the mailbox's end, which readers
stop at and the next acceptance cuts. Any other damage — a whole record that
fails its CRC, records after the damage, damage before where this process
knows records reach — may hold accepted messages: readers raise
``CorruptSessionError`` instead of reporting fewer, and acceptances are
refused before a byte is written. A message above the store's
``max_record_bytes`` is refused (``MESSAGE_TOO_LARGE``) before anything is
written.

``MailboxWriter`` accepts many messages into one mailbox through descriptors
it keeps open (the session file's, for its lock, and the mailbox's): a
resident child's followups pay no ``open``/``close`` each. ``accept`` is one
such writer used once. Given a ``ChangeWatch`` (``store/changes.py``), a held
writer learns from the kernel whether anyone else touched its mailbox, and
pays no ``stat`` while nobody did.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from .appender import WIDEST_SEQ, append_records, frame_record, open_appendable
from .events import widest_event
from .changes import ChangeWatch, Watched
from .errors import CorruptSessionError, InvalidRecordError, LockTimeoutError
from .extent import reach
from .framing import FRAME, scan
from .ids import IdGenerator
from .mailbox_read import checkpoint_key, pending
from .projection import Projection
from .reader import read_session_file
from .records import mailbox_problem
from .root import Store
from .session_file import SessionLock

__all__ = ["MailboxWriter", "accept", "check_message", "require_consumed_prefix"]


def accept(
    store: Store, session_id: str, *, source: dict[str, Any], content: Any, ids: IdGenerator, wake: bool = True,
    lock: SessionLock | None = None, lock_timeout: float | None = None,
) -> str:
    """Durably append a message; returns its id once it is on stable storage (``lock``: the caller's, kept
    open; ``lock_timeout``: as ``MailboxWriter.accept``)."""
    writer = MailboxWriter(store, session_id, lock=lock)  # SessionNotFoundError
    try:
        return writer.accept(source=source, content=content, ids=ids, wake=wake, lock_timeout=lock_timeout)
    finally:
        writer.close()


def check_message(store: Store, session_id: str, *, source: Any, content: Any, wake: bool = True) -> None:
    """Raise what ``accept`` would refuse this message for, touching nothing (``InvalidRecordError``,
    ``MESSAGE_TOO_LARGE``): a caller that must do something durable before it accepts (resume the
    recipient) checks first, so a message that can never be accepted changes nothing."""
    _refuse(store, session_id, checkpoint_key(session_id), {"id": _SAMPLE_ID, "ts": 0.0, "source": source, "content": content, "wake": wake})


# an id as long as every id is: the sample record frames to the size the real one will
_SAMPLE_ID = "0" * 26


# more than the log's record of a message (``message/accepted``: its envelope, ``mailbox_end``, the
# writer's epoch) can add to its mailbox record (tests/store/test_message_fits_the_log.py)
LOG_MARGIN = 192


def _refuse(store: Store, session_id: str, key: str, record: dict[str, Any]) -> None:
    """What readers would refuse as damage (a ``source`` that is no map), what msgpack cannot encode,
    what is too large (the widest seq bounds it): refused before the lock or the file are touched.

    Too large includes a message whose mailbox record fits while the record the turn that takes it
    logs does not: acknowledged, it could never be taken, and would block every message behind it.
    Only a record within ``LOG_MARGIN`` of the limit is framed the log's way too (a followup's hot
    path encodes its content once)."""
    widest = {**record, "seq": WIDEST_SEQ}
    problem = mailbox_problem(widest)
    if problem is not None:
        raise InvalidRecordError(f"a message for {session_id}", problem)
    framed = frame_record(widest, store.max_record_bytes, key, "MESSAGE_TOO_LARGE")
    if len(framed) + LOG_MARGIN > store.max_record_bytes:
        data = {"message_id": record["id"], "source": record["source"], "content": record["content"], "mailbox_end": WIDEST_SEQ, "quiet": True}
        frame_record(widest_event("message/accepted", data), store.max_record_bytes, key, "MESSAGE_TOO_LARGE")


class MailboxWriter:
    """One session's mailbox, held open for acceptances. Thread-safe; the owner closes it.

    The session's lock (an ``flock`` on its file, ``SessionLock``) and the
    mailbox's descriptor stay open between acceptances. Under the lock, every
    acceptance checks that ``sessions/<id>`` still names the locked file (``gc``
    renames a session away under its lock: ``SessionNotFoundError``, nothing is
    accepted beside a session that is gone) and that the mailbox path still
    names the open mailbox (else it is opened again), so a kept descriptor never
    appends to a file nobody reads. With ``changes`` (its owner's inotify instance, shared by its
    writers and closed by the owner) the open mailbox is watched: while no event came since the
    writer's own last write, the path still names it and nobody else wrote it, and the acceptance
    makes no ``stat`` (whose reading of the timestamps costs the next fsync the inode's write,
    ``store/changes.py``); without, or when the kernel gives no watch, it compares the ``stat``'s
    size, mtime and ctime with what its last acceptance left. Acceptances are serialised by a mutex:
    ``flock`` belongs to an open file description, so two threads sharing one
    descriptor would not exclude each other. ``close`` never waits: an
    acceptance in progress closes the descriptors when it ends, and one made
    after ``close`` opens and closes its own.
    """

    def __init__(self, store: Store, session_id: str, *, lock: SessionLock | None = None, changes: ChangeWatch | None = None) -> None:
        self._store = store
        self.session_id = session_id
        self._path = store.path(session_id, "mailbox")
        self._key = checkpoint_key(session_id)
        self._what = f"mailbox of {session_id}"
        self._mutex = threading.Lock()  # one acceptance at a time
        self._state = threading.Lock()  # guards what follows; never held across I/O
        self._busy = False
        self._closed = False
        # the lock held (None once closed) and whether it is ours to close; the open mailbox
        self._lock: SessionLock | None = lock if lock is not None else SessionLock(session_id, store.session_path(session_id))
        self._own_lock = lock is None
        self._fd = -1
        self._file: tuple[int, int] | None = None  # (st_dev, st_ino) of the open mailbox
        self._changes = changes  # the owner's; None: compare timestamps
        self._watched: Watched | None = None  # the open mailbox's watch in ``changes``: None, timestamps
        # the mailbox as our last acceptance left it (``_state_of``; nothing when watched, the watch says what
        # changed): None until an acceptance checked it
        self._seen: tuple[int, ...] | None = None
        # the store's checkpoint of the mailbox as our last acceptance left it: while it is still the store's and
        # the watch saw nobody touch the file, nothing but padding follows it (``append_records``'s ``unchanged``)
        self._left: tuple[int, int] | None = None

    def accept(self, *, source: dict[str, Any], content: Any, ids: IdGenerator, wake: bool = True, lock_timeout: float | None = None) -> str:
        """Durably append a message; returns its id once it is on stable storage (as ``accept``).

        ``lock_timeout``: the longest to wait for the session's lock, in seconds, then ``LockTimeoutError``
        with nothing written (a caller's deadline, or a bound on a stopped holder); ``None``: wait for it."""
        store = self._store
        message_id = ids.new()
        record = {"id": message_id, "ts": time.time(), "source": source, "content": content, "wake": wake}
        _refuse(store, self.session_id, self._key, record)
        deadline = None if lock_timeout is None else time.monotonic() + lock_timeout
        if not self._mutex.acquire(timeout=-1 if lock_timeout is None else lock_timeout):
            raise LockTimeoutError(store.session_path(self.session_id))  # another acceptance of ours holds it
        try:
            with self._state:
                self._busy = True
            try:
                if self._lock is None:  # closed: a lock of our own for this acceptance (closed after it)
                    self._lock, self._own_lock = SessionLock(self.session_id, store.session_path(self.session_id)), True
                # SessionNotFoundError when the session is gone
                self._lock.acquire(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
                try:
                    fresh = self._fd < 0  # checked before the open, which may make the file: a refusal leaves none
                    committed = 0  # where the log's consumed messages end: damage before it is no torn tail to cut
                    if fresh:
                        committed = require_consumed_prefix(store, self.session_id, locked=True)
                    size, untouched = self._open_mailbox()
                    if not untouched:
                        # this writer's first acceptance, or another hand wrote the mailbox since our last one
                        if not fresh:
                            committed = require_consumed_prefix(store, self.session_id, locked=True)
                        # without a checkpoint the append reads from the start: to the data's reach, not
                        # through zeros someone extended the file with (``extent.reach``); they stay zeros
                        size = min(size, reach(self._fd, store.max_record_bytes))
                    # watched only: a timestamp comparison may miss another writer's append within one clock tick,
                    # which the look at the checkpoint still finds (and appends after, never over it)
                    unchanged = (untouched and self._watched is not None and self._left is not None
                                 and store.index_tails.get(self._key) == self._left)
                    self._seen = None  # until this acceptance is whole: one that failed is followed by a check
                    append_records(self._fd, [record], tails=store.index_tails, key=self._key, owner=self.session_id,
                                   limit=store.max_record_bytes, check=mailbox_problem, too_large="MESSAGE_TOO_LARGE",
                                   size=size, padded=True, committed=committed, unchanged=unchanged)
                    self._left = store.index_tails.get(self._key)
                    watched = self._watched
                    if watched is not None:
                        self._changes.settle(watched)  # at once: what the kernel counted so far was this write
                    store.durability.commit_append(self._fd, self._what)
                    self._seen = () if watched is not None else _state_of(os.fstat(self._fd))
                finally:
                    self._lock.release()
            finally:
                with self._state:
                    self._busy = False
                    files = self._detach() if self._closed else None
                _close(files)
        finally:
            self._mutex.release()
        return message_id

    def close(self) -> None:
        """Close the descriptors now, or (an acceptance in progress) when it ends. Idempotent."""
        with self._state:
            self._closed = True
            files = None if self._busy else self._detach()
        _close(files)

    def _detach(self) -> _Held:
        """Under ``_state``: take the descriptors to close, leaving none held."""
        files = _Held(self._fd, self._lock if self._own_lock else None, self._changes, self._watched)
        self._fd, self._file, self._lock, self._watched = -1, None, None, None
        return files

    def _open_mailbox(self) -> tuple[int, bool]:
        """Under the lock: the open mailbox's size, and whether nobody touched it since our last acceptance
        (False for a first one), (re)opening it unless the path still names it.

        A watched mailbox with no event since our last write is the file its path names (unlinking it,
        renaming it, putting another file in its place all change its links) and nobody changed it: its
        size is our descriptor's end, and no ``stat`` reads the timestamps (``store/changes.py``)."""
        watched = self._watched
        if watched is not None and self._seen is not None and not self._changes.changed(watched):
            return os.lseek(self._fd, 0, os.SEEK_END), True
        try:
            info = os.stat(self._path, follow_symlinks=False)
            if self._fd >= 0 and (info.st_dev, info.st_ino) == self._file:
                return info.st_size, watched is None and self._seen == _state_of(info)
        except OSError:
            pass  # absent (made by the first message) or unreadable: the open below says which
        _close(_Held(self._fd, None, self._changes, watched))
        self._fd, self._file, self._watched = -1, None, None
        self._seen = None  # another file: checked afresh
        # in place: an acceptance writes over the padding (``pwrite`` on an ``O_APPEND`` descriptor would append)
        fd, info = open_appendable(self._path, owner=self.session_id, key=self._key, in_place=True)
        self._fd, self._file = fd, (info.st_dev, info.st_ino)
        if self._changes is not None:
            self._watched = self._changes.watch(fd)  # before the check this first acceptance makes
        return info.st_size, False


def require_consumed_prefix(store: Store, session_id: str, projection: Projection | None = None, *, locked: bool = False) -> int:
    """Before an acceptance, under the session lock (``locked``): ``CorruptSessionError`` unless the mailbox still
    holds the messages its log consumed, and the ones it has not consumed read without damage that
    is no torn tail (``fsck`` and listings ask too; ``projection``: the log's, when the caller has it).
    Returns where the consumed messages end (0: none, or a log from before the end was recorded): the
    records before it were acknowledged, so damage there is corruption, never a torn tail an
    acceptance may cut and write over (the check reads only from there on: O(pending)).

    A mailbox emptied, overwritten or cut short behind the store's back no longer lines up with the
    log: a message appended to it would be acknowledged and never taken by any turn (``pending``
    refuses the disagreement). Damage among the unconsumed messages — with nothing consumed, in
    the whole mailbox — would be cut as if torn, or a message appended after it where no reader
    finds it (``pending`` refuses that too). Checked at a writer's first acceptance (``accept``
    makes a writer each time) and whenever another hand touched the file since the writer's last
    acceptance (its watch had an event, or, unwatched, the file's size, mtime or ctime is not what
    that acceptance left), so a resident writer's followups pay nothing for it while nobody else
    writes: the log's projection, then ``pending`` from where the log says the unconsumed messages
    start (O(pending); the whole mailbox when that does not land on a record). Not guaranteed: a
    change in place made during a writer's own acceptance (between its write and its look at the
    file), through a shared memory mapping of a watched mailbox, or from another machine, is found
    by the readers (``pending``, ``check``), not by that writer."""
    if projection is None:
        from .log import read_projection  # the log module sits above this one

        projection = read_projection(store, session_id)
    # a fork's projection counts only what it consumed from its own mailbox (its seed's records are its source's)
    consumed, last_id, mailbox_end = projection.consumed, projection.last_message_id, projection.mailbox_end
    if not consumed:
        pending(store, session_id, consumed=0, last_consumed_id=None, locked=locked)  # every message is unconsumed: all are read
        return 0
    try:
        size = os.lstat(store.path(session_id, "mailbox")).st_size
    except FileNotFoundError:
        size = 0
    if mailbox_end is not None and size < mailbox_end:
        raise CorruptSessionError(
            session_id, f"mailbox and log disagree: log consumed {consumed} message(s) ending at "
            f"{last_id!r}, at byte {mailbox_end} of a mailbox of {size} bytes",
        )
    last = last_id if isinstance(last_id, str) else None
    if mailbox_end and last is not None and not _ends_with(store, session_id, mailbox_end, last, consumed - 1):
        mailbox_end = None  # the consumed messages are not where the log says (zeroed in place?): read them all
    pending(store, session_id, consumed=consumed, last_consumed_id=last, mailbox_end=mailbox_end, locked=locked)
    return mailbox_end or 0


# How far before the end of the last consumed message its record is looked for (``_ends_with``);
# a longer message is confirmed by reading the whole mailbox instead.
CONFIRM_WINDOW = 64 * 1024


def _ends_with(store: Store, session_id: str, end: int, message_id: str, seq: int) -> bool:
    """Whether the record that ends at byte ``end`` of the mailbox is message ``message_id`` (``seq``), read from
    at most ``CONFIRM_WINDOW`` bytes before it. The size alone does not tell: a mailbox zeroed in place
    keeps its size, its unconsumed part reads as padding (no pending message) and an acceptance would
    write its message where no turn takes it. False sends the caller to the whole mailbox (O(mailbox)),
    which compares every consumed message with the log; True costs one small read."""
    base = max(0, end - CONFIRM_WINDOW)
    data = read_session_file(store, session_id, "mailbox", offset=base, stop=lambda _fd: end) or b""
    key, at = message_id.encode(), len(data)
    while (at := data.rfind(key, 0, at)) >= 0:
        for start in range(max(0, at - 24), at):  # the id is the record's first value: its frame begins just before
            if FRAME.unpack_from(data, start)[0] == len(data) - start - FRAME.size:
                found = scan(data[start:], start_seq=seq, check=mailbox_problem)
                if found.damage is None and [r["id"] for r in found.records] == [message_id]:
                    return True
    return False


def _state_of(info: os.stat_result) -> tuple[int, int, int]:
    """What changes when anyone writes an unwatched mailbox (an acceptance in place changes no size).

    Without a watch, the timestamps are the only trace of bytes changed in place by a program
    outside the store (every writer of the store appends: its acceptance shows in the size or over
    the padding). Reading them costs each acceptance's fsync the inode's write on kernels with
    multigrain timestamps (``store/changes.py``), which is why a supervisor's held writers are
    watched instead: a message must not be acknowledged into a mailbox whose queued messages
    another program damaged, and this is how a writer without a watch keeps that promise."""
    return info.st_size, info.st_mtime_ns, info.st_ctime_ns


@dataclass(frozen=True)
class _Held:
    """What a writer keeps open, taken from it to close."""

    fd: int
    lock: SessionLock | None
    changes: ChangeWatch | None
    watched: Watched | None


def _close(files: _Held | None) -> None:
    if files is None:
        return
    if files.watched is not None and files.changes is not None:
        files.changes.unwatch(files.watched)
    if files.fd >= 0:
        os.close(files.fd)
    if files.lock is not None:
        files.lock.close()
