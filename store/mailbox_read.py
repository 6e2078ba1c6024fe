"""Reading a durable mailbox: its messages, those not yet consumed, and where its data ends.

The format, and the rule that tells a torn tail from damage, are the
writer's (``store/mailbox.py``, FORMAT.md §8); what is here only reads. A
reader that finds damage which is no torn tail reads again under the
session's lock, where no acceptance can be in flight, before it reports
the mailbox corrupt (``scan_mailbox``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from .atomic import NOFOLLOW
from .errors import CorruptSessionError, UnavailableSessionError
from .extent import data_end_of, read_records
from .framing import Damage, ScanResult, data_end, scan, torn_tail
from .records import mailbox_problem
from .root import Store
from .session_file import SessionLock

__all__ = ["MailboxMessage", "MailboxScan", "checkpoint_key", "scan_mailbox", "read_mailbox", "pending", "mailbox_data_end"]


@dataclass(frozen=True)
class MailboxMessage:
    id: str
    ts: float
    source: dict[str, Any]
    content: Any
    wake: bool = True
    end: int = 0  # byte offset just after this record in the mailbox file

    def to_event_data(self) -> dict[str, Any]:
        """The ``message/accepted`` data; ``mailbox_end`` lets the next reader skip the consumed prefix."""
        return {"message_id": self.id, "source": self.source, "content": self.content, "mailbox_end": self.end}


def checkpoint_key(session_id: str) -> str:
    """The mailbox's name among a store handle's append checkpoints (``Store.index_tails``)."""
    return f"mailbox/{session_id}"


@dataclass(frozen=True)
class MailboxScan:
    """What one read of a mailbox (from ``base``, where record ``start_seq`` starts) found."""

    base: int
    data: bytes  # the bytes read, from ``base``
    result: ScanResult
    corrupt: bool  # the scan stopped at damage that is no torn tail, judged where no acceptance was in flight
    more: bool = False  # ``data`` stops at that damage and more data follows it (``extent.read_records``)

    @property
    def misplaced(self) -> bool:
        """Damage right at ``base`` (> 0): ``base`` is no record's start, the caller reads the whole mailbox."""
        damage = self.result.damage
        return damage is not None and damage.offset == self.base and self.base > 0


def scan_mailbox(store: Store, session_id: str, *, base: int = 0, start_seq: int = 0, locked: bool = False) -> MailboxScan | None:
    """Read and scan the mailbox from ``base`` as a log is read (``extent.read_records``: never through zeros the file
    was extended with, nor to a stray byte far past its records); ``None`` when there is none, ``UnavailableSessionError`` when unreadable.

    An acceptance writes its record with one ``pwrite`` under the session lock, and a reader that does not hold
    the lock may see part of it: a frame not all there yet, or bytes after where this process's checkpoint
    (read after the bytes were) says records reach. That is an acknowledgment in flight, not damage. So damage
    that is no torn tail is judged only where no acceptance can be in flight: a caller without the lock
    (``locked`` false: every reader but an acceptance's own check) has it read again under the lock, taken
    only then. A caller that holds it must say so: ``flock`` would wait for the caller's own descriptor.
    """
    checkpoint = store.index_tails.get(checkpoint_key(session_id))  # before the read: records reached this far then
    committed_end = (checkpoint[0] if checkpoint else 0) - base
    try:
        fd = os.open(store.path(session_id, "mailbox"), os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
        try:  # judged while it is open: past a bounded read, the rule looks at the file itself (``Beyond``)
            data, beyond = read_records(fd, base, store.max_record_bytes)
            result = scan(data, start_seq=start_seq, base_offset=base, check=mailbox_problem, padded=True,
                          last=None if beyond is None else beyond.last)
            found, damage = MailboxScan(base, data, result, False, beyond is not None), result.damage
            if damage is None or found.misplaced:
                return found
            local = Damage(damage.offset - base, damage.dropped, damage.reason, damage.detail)
            if torn_tail(data, local, start_seq + len(result.records), padded=True, committed_end=committed_end, beyond=beyond):
                return found
        finally:
            os.close(fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnavailableSessionError.of(session_id, "its mailbox cannot be read", exc) from None
    if locked:
        return replace(found, corrupt=True)
    lock = SessionLock(session_id, store.session_path(session_id))
    try:
        lock.acquire(bounded=True)  # a stuck holder: LockTimeoutError, not a reader hung for good
        try:
            return scan_mailbox(store, session_id, base=base, start_seq=start_seq, locked=True)
        finally:
            lock.release()
    finally:
        lock.close()


def _messages(session_id: str, found: MailboxScan) -> list[MailboxMessage]:
    """The messages ``found`` holds; ``CorruptSessionError`` when it stopped at damage that is no torn tail."""
    result, damage = found.result, found.result.damage
    if found.corrupt and damage is not None:
        detail = f" ({damage.detail})" if damage.detail else ""
        raise CorruptSessionError(
            session_id, f"its mailbox is damaged: {damage.reason} at byte {damage.offset}{detail} is no torn tail "
            "(FORMAT.md §3.3), and accepted messages may lie in it", offset=damage.offset,
        )
    ends = result.offsets[1:] + [result.end]
    return [
        MailboxMessage(r["id"], float(r["ts"]), r["source"], r.get("content"), r.get("wake", True), end)
        for r, end in zip(result.records, ends)
    ]


def read_mailbox(store: Store, session_id: str, *, locked: bool = False) -> list[MailboxMessage]:
    """The accepted messages: the mailbox's valid prefix, a torn tail left out (the next acceptance cuts it).
    ``CorruptSessionError`` for any other damage (it may hide accepted messages: never fewer, silently);
    ``UnavailableSessionError`` when the file cannot be read. ``locked``: the caller holds the session lock."""
    found = scan_mailbox(store, session_id, locked=locked)
    return [] if found is None else _messages(session_id, found)


def pending(
    store: Store, session_id: str, *, consumed: int, last_consumed_id: str | None, mailbox_end: int | None = None,
    locked: bool = False,
) -> list[MailboxMessage]:
    """Accepted messages the log has not consumed, in FIFO order.

    With ``mailbox_end`` (the byte offset after the last consumed message, recorded
    in its ``message/accepted``), only the unconsumed suffix is read: O(pending),
    not O(every message ever accepted). Without it, or if it does not land on
    record ``consumed``, the whole mailbox is read and checked against the log.
    ``CorruptSessionError`` as ``read_mailbox`` for damage in what is read that is
    no torn tail, and when the mailbox and the log disagree.
    """
    if mailbox_end is not None and consumed > 0:
        found = scan_mailbox(store, session_id, base=mailbox_end, start_seq=consumed, locked=locked)
        if found is not None and not found.misplaced:
            messages = _messages(session_id, found)
            if messages or (not found.more and data_end(found.data) == 0):  # nothing after it, or only padding
                return messages
    disagree = f"mailbox and log disagree: log consumed {consumed} message(s) ending at {last_consumed_id!r}"
    try:
        messages = read_mailbox(store, session_id, locked=locked)
    except CorruptSessionError as exc:
        if not consumed:
            raise
        # the consumed prefix does not read either: both said, the disagreement first (what refuses acceptances)
        raise CorruptSessionError(session_id, f"{disagree}; {exc.fields['reason']}", offset=exc.fields.get("offset")) from None
    if consumed > len(messages) or (consumed and messages[consumed - 1].id != last_consumed_id):
        raise CorruptSessionError(session_id, disagree)
    return messages[consumed:]


def mailbox_data_end(store: Store, session_id: str) -> int:
    """Where the mailbox's data ends (its size less the zero padding; 0 when absent): it grows with every acceptance.

    A bound, not a record boundary (a record's own last bytes may be zeros),
    but every record begins with a non-zero length, so each acceptance moves
    it. An acceptance into the padding leaves the file's size as it was, and
    its mtime is too coarse to order two writes, so a watcher compares this. One
    ``pread`` of the file's last 8 KiB (the padding is under 4 KiB); when those
    are all zeros, the file's data extents backwards (``store/extent.py``).

    ``OSError`` for anything but a file in the mailbox's place, at once: the open does not wait
    for a FIFO's writer (the supervisor's watcher asks on its event loop), and a FIFO has no end
    to seek to, nor a folder bytes to read. The size is where the descriptor seeks to, not an
    ``fstat``: a watcher asks every poll, and reading the file's timestamps would make the next
    acceptance's fsync write the inode too (``store/changes.py``).
    """
    try:
        fd = os.open(store.path(session_id, "mailbox"), os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
    except FileNotFoundError:
        return 0
    try:
        return data_end_of(fd)
    finally:
        os.close(fd)
