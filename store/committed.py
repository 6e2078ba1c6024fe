"""Where a child's committed records end, and a log found to have lost some (FORMAT.md §9).

When a child settles, its parent's index records the file offset where the child's log's records
ended then (``Settled.end``). Nothing cuts committed records, so they reach at least that far for as
long as the child exists, through later resumptions too (``IndexEntry.committed_end`` keeps the
offset while the child is active again). A log whose valid records end before it lost committed
ones behind the store's back: its last ``turn/end`` changed in place or cut short (which reads like
the torn tail of a crash mid-append, FORMAT.md §3.3), zeroed (which reads like padding) or cut off.

A reader that takes such a log at its word calls it torn, and the resume path repairs a torn log:
it would cut the committed record and close the turn as a crash, turning a child that completed
into an interrupted one. So every reader asks here before it believes a torn tail: ``show``,
listings, ``fsck``, ``subagents log`` and ``gc`` through ``CommittedEnds`` (one read of each
parent's index per pass), ``load_projection`` (so ``read_projection`` and the resume path) through
``committed_end`` when a log reads torn, and ``LogWriter.open`` also when its repair would close an
open turn. A log that reads clean and whole costs nothing: only those cases read the parent's index.

A log that reads clean can have lost committed records too: a whole last turn zeroed (no torn
tail, no open turn), or a log cut at the record boundary before its ``turn/end``. A cold resume
reads with ``verify_committed`` (every log compared with its row), since it would run the zeroed
turn's message again; ``fsck`` and ``show`` read every settled child against its row. Other readers
take a clean log at its word. Not guaranteed: a child that lost records and was never settled since
(its first run's records) is not told from a log that never had them.

The fold of each parent's index kept here (the ends, read on from where the last read stopped) also
says which children are listed and each one's origin and mode (``listed_rows``): what a drain of a
few named children asks, without a listing of all of them.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, TypeVar

from .errors import SubagentError
from .header import SessionHeader
from .atomic import NOFOLLOW
from .index_read import MARK, IndexFold, Listed, fold_on, read_index
from .reader import Inspection, inspect, lost_damage, open_session
from .root import Store
from .session_file import SessionFile

__all__ = ["CommittedEnds", "committed_end", "listed_rows", "lost_committed"]

T = TypeVar("T")


@dataclass
class _Folded:
    """A children index as this process last read it whole and clean: the same file (``ino``), read to
    ``end`` (the ``mark`` bytes before it, to tell a file rewritten in place), and its fold."""

    ino: int
    end: int
    next_seq: int
    mark: bytes
    fold: IndexFold


# the children indexes this process read last (parent folder → its fold): a cold resume asks one
# child's committed end, and reading its parent's whole index each time cost ~12 ms per 1,000
# siblings (a probe: a followup to a settled child of a parent with 4,000 children took 50 ms)
_FOLDED: OrderedDict[str, _Folded] = OrderedDict()
_FOLDED_LOCK = threading.Lock()  # held only to take a fold out of ``_FOLDED`` or put it back
# each index's own lock, held while its fold is read on: readers of one index take turns (the second
# reads on from where the first stopped), and a first read of a root's large index (seconds for
# hundreds of thousands of records) holds up no other parent's reader. A lock lives while its fold is
# kept or a reader holds it (``_reading``); one dropped early costs a duplicate read, never a wrong one
_READING: dict[str, threading.Lock] = {}
_FOLDED_MAX = 256


def _ends_of(store: Store, parent_id: str) -> dict[str, int]:
    """Each child's committed end (in its file) per the parent's index (which reads around damage):
    from the kept fold (``_kept``), else read whole, the careful way (``read_index``)."""
    ends = _kept(store, parent_id, lambda fold: dict(fold.committed))
    if ends is not None:
        return ends
    # outside the lock: a careful read of one parent's index holds up no other's
    return {e.id: e.committed_end for e in read_index(store, parent_id).entries if e.committed_end is not None}


def listed_rows(store: Store, parent_id: str, child_ids: Iterable[str]) -> dict[str, Listed] | None:
    """Which of ``child_ids`` the parent's index lists, each with its ``Listed`` (origin, mode), from the
    kept fold; None when the index does not read clean (missing, damaged, a record in flight): the caller
    then reads it the careful way (``catalog.listed_children``), which says what is wrong. A drain of a
    few named children asked a listing of all of them, and decoded every record of the index, each
    time: ~25 µs and ~1.4 KB a child the parent ever had, per drain (found by a probe)."""
    return _kept(store, parent_id, lambda fold: {c: found for c in child_ids if (found := fold.listed(c)) is not None})


def _kept(store: Store, parent_id: str, answer: Callable[[IndexFold], T]) -> T | None:
    """``answer`` of the parent's kept fold, brought up to date; None when its index does not read clean.

    An index is appended to (its records are independent), and rewritten only as a new file (a
    reindex, a compaction: another inode). So a file this process read before, whole and without
    damage, is read on from where it stopped: only the records appended since. Anything else (another
    file, one shorter or changed before that point, damage, a record in flight) gets None, and the
    caller reads it the careful way; a file read from its start is kept only when it read clean."""
    path = store.children_index_path(parent_id)
    with _reading(path):  # one reader of this index's fold at a time: each reads on from where the last stopped
        with _FOLDED_LOCK:
            known = _FOLDED.pop(path, None)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
            try:
                known = _read_on(fd, known)
            finally:
                os.close(fd)
        except OSError:
            known = None
        if known is None:
            return None
        found = answer(known.fold)
        with _FOLDED_LOCK:
            _FOLDED[path] = known
            while len(_FOLDED) > _FOLDED_MAX:
                _drop_lock(_FOLDED.popitem(last=False)[0])
        return found


@contextmanager
def _reading(path: str) -> Iterator[None]:
    """Hold ``path``'s own lock (``_READING``); dropped after the last holder when no fold of it is kept."""
    with _FOLDED_LOCK:
        lock = _READING.setdefault(path, threading.Lock())
    with lock:
        yield
    with _FOLDED_LOCK:
        if path not in _FOLDED:
            _drop_lock(path)


def _drop_lock(path: str) -> None:
    """Forget ``path``'s lock unless a reader holds it (that reader forgets it on its way out);
    called under ``_FOLDED_LOCK``."""
    lock = _READING.get(path)
    if lock is not None and not lock.locked():
        del _READING[path]


def _read_on(fd: int, known: _Folded | None) -> _Folded | None:
    """The fold of the open index, read on from ``known`` when it is still this file's prefix, else
    from its start; ``None`` when what it reads is not clean (the caller reads it the careful way)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise OSError(errno.EINVAL, "not a regular file")
    if known is not None and known.ino == info.st_ino and known.end <= info.st_size and (
            known.end < MARK or os.pread(fd, MARK, known.end - MARK) == known.mark):
        # folded as read: on None, ``known`` (partly folded) is dropped for a fold from the start
        more = fold_on(fd, known.end, info.st_size, known.fold, known.next_seq, known.mark)
        if more is not None:
            return _Folded(info.st_ino, *more, known.fold)
    fold = IndexFold(rows=False)  # kept for as long as the process lives: its ends and ``Listed`` only
    whole = fold_on(fd, 0, info.st_size, fold, 0, b"")
    return None if whole is None else _Folded(info.st_ino, *whole, fold)


def committed_end(store: Store, header: SessionHeader, file: SessionFile) -> int | None:
    """Where the session's records reach for sure (an offset in its log), per its parent's index;
    None when nothing says: a top-level session, no settled row with an end, or an index that does
    not read (nothing is claimed from a file that cannot be read)."""
    end = None if header.parent_session is None else _ends_of(store, header.parent_session).get(header.id)
    return None if end is None else end - file.data_start


def lost_committed(found: Inspection, committed: int) -> Inspection:
    """``found``, made ``corrupt`` when its valid records end before ``committed`` (in its log)."""
    if found.status == "corrupt" or found.end >= committed:
        return found
    return replace(found, status="corrupt", damage=lost_damage(found.end, committed, found.damage))


class CommittedEnds:
    """``lost_committed`` against each child's index row (``show`` reads one session, ``fsck`` every
    one: a parent's children index is read once per pass, not once per child). A row read after a
    child's log may be newer than that log (a resume settled again meanwhile): a log shorter than its
    row is read again, after the row, before it is called corrupt."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._ends: dict[str, dict[str, int]] = {}  # parent -> child -> where its records reach (in the file)

    def apply(self, found: Inspection) -> Inspection:
        parent, session_id = found.header.parent_session, found.header.id
        if parent is None:
            return found
        ends = self._ends.get(parent)
        if ends is None:
            ends = self._ends[parent] = _ends_of(self._store, parent)
        end = ends.get(session_id)
        if end is None:
            return found
        try:
            with open_session(self._store, session_id) as file:
                committed = end - file.data_start
            if found.end < committed:
                found = inspect(self._store, session_id)
        except (SubagentError, OSError):
            return found  # gone or unreadable since: the caller's own read stands
        return lost_committed(found, committed)
