"""Following a session log as it grows: what ``subagents log --follow`` reads.

``LogTail`` remembers where the valid prefix ended and the next seq; each
``poll`` reads only the bytes after it. Read-only. The file's size does not
say whether the log grew: a writer appends in place, into the zero padding
after the last record (FORMAT.md §3.4), so each poll reads from its offset
(one open, one ``pread``) and an all-zero remainder means nothing new.
At the edges: damage at the end of the new bytes may be a write still in
flight, so it is not reported, only waited for (the next poll scans it again);
damage with a committed record past it (``reader.classify``: ``corrupt``) is
read again under the session lock (``inspect``: a lockless read can see an
append half copied) and, confirmed, is the tail's ``damage``: nothing after it
will ever read, so a follower reports it and stops (a follower that waited on
would wait in silence for good). A log that shrank under us (``store fsck --repair`` cut a torn tail) is read
again from the start and only the events past the ones already returned are
given. Not thread-safe: one reader per tail.
"""

from __future__ import annotations

import os
from typing import Any

from .atomic import NOFOLLOW
from .extent import Beyond, read_records
from .framing import Damage, zeros_from
from .reader import Inspection, classify, inspect, open_session, scan_events
from .root import Store

__all__ = ["LogTail"]


class LogTail:
    """New events of one session's log, poll after poll, starting after ``start``."""

    def __init__(self, store: Store, session_id: str, start: Inspection) -> None:
        self._store = store
        self._session_id = session_id
        self._path = store.session_path(session_id)
        self._data_start: int | None = None  # the log's start in the session file, read at the first poll
        self._end = start.end  # byte length of the valid prefix already returned
        self._next_seq = len(start.events)
        # committed damage where the valid prefix ends: the log shows nothing more, ever
        self._damage = start.damage if start.status == "corrupt" else None
        self._root = start.header.parent_session is None  # its commit points (``reader.classify``)

    @property
    def damage(self) -> Damage | None:
        """Where and why the log is ``corrupt`` (its valid prefix returned, nothing after it ever will be),
        or ``None`` while it may still grow. Offsets are the log's, as ``inspect`` gives them."""
        return self._damage

    def poll(self) -> list[dict[str, Any]]:
        """The events committed since the last poll (possibly none); none once ``damage`` is set."""
        if self._damage is not None:
            return []
        if self._data_start is None:
            with open_session(self._store, self._session_id) as file:
                self._data_start = file.data_start
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
        except FileNotFoundError:
            return self._read_again()  # gone under us: start over from what is valid now
        try:
            read = self._read_after(fd, self._data_start + self._end)
            if read is None:  # cut back under us (a repair): start over from what is valid now
                return self._read_again()
            added, beyond = read
            if beyond is None and zeros_from(added):
                return []  # nothing, or only the padding: no record was written since
            result = scan_events(added, start_seq=self._next_seq, base_offset=self._end, beyond=beyond)
            if result.damage is not None:
                local = Damage(result.damage.offset - self._end, result.damage.dropped, result.damage.reason, result.damage.detail)
                if classify(added, local, self._next_seq + len(result.records), root=self._root, beyond=beyond) == "corrupt":
                    return self._read_again()  # only when damage is found: the whole log, under the lock if need be
        finally:
            os.close(fd)
        self._end, self._next_seq = result.end, self._next_seq + len(result.records)
        return list(result.records)

    def _read_again(self) -> list[dict[str, Any]]:
        """The events past those already returned, from the whole log read as ``inspect`` reads it (its
        damage, when it calls it ``corrupt``, becomes the tail's)."""
        again = inspect(self._store, self._session_id)
        events = again.events[self._next_seq:]
        self._end, self._next_seq = again.end, len(again.events)
        if again.status == "corrupt":
            self._damage = again.damage
        return events

    def _read_after(self, fd: int, offset: int) -> tuple[bytes, Beyond | None] | None:
        """The open file's bytes from ``offset`` on, read as a log is (``extent.read_records``: not through
        zeros, nor to a stray byte far past the records); ``None`` when it is shorter than ``offset``."""
        if os.fstat(fd).st_size < offset:
            return None
        return read_records(fd, offset, self._store.max_record_bytes)
