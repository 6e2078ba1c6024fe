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
"""

from __future__ import annotations

from dataclasses import replace

from .errors import SubagentError
from .header import SessionHeader
from .index_read import read_index
from .reader import Inspection, inspect, lost_damage, open_session
from .root import Store
from .session_file import SessionFile

__all__ = ["CommittedEnds", "committed_end", "lost_committed"]


def _ends_of(store: Store, parent_id: str) -> dict[str, int]:
    """Each child's committed end (in its file) per the parent's index (which reads around damage)."""
    return {e.id: e.committed_end for e in read_index(store, parent_id).entries if e.committed_end is not None}


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
