"""The catalog's state records, written beside the lease change they describe.

A child's row in its parent's children index (``store/index.py``) ends with
its latest state record: ``settled`` once its lease is released (the outcome,
the error and the last activity of its log at that moment), ``active`` when
its lease is taken again. Both are written by ``store/lease.py`` inside the
critical section of that lease change, under the child's session lock, so a
row and the lease it describes change together: ``settled`` is appended
right after the lease is written ``released``, ``active`` right before it is
taken again, so a re-activation's ``active`` always lands after the
``settled`` it invalidates, and a listing that finds ``settled`` last may
take the row as it stands, without the child's files.

Lock order: a session lock, then the parent's index lock (never the other
way round). What is not guaranteed: a ``settled`` row is not fsync'd, and one
that cannot be written (an unreadable header, identity or index) is skipped
with a log line; either way the listing falls back to the child's own files,
the authority. The row records where the log ended and the file's
modification time after the release (``end``, ``mtime_ns``): a listing
whose ``lstat`` finds the file shorter, or written since, reads the file
instead, so a file damaged in place behind the store's back lists as damaged.
A row that lies while its file keeps its time (an index edited by hand) is
caught by ``check`` (``index-row``), not by every listing.

A settled child gains a child from outside (a one-shot start under it,
``create_under_settled_parent``), or from a delegation of its own that was
under way as it settled (a child cancelled by its parent: the creation is
published, the release writes the row from an index that does not list it
yet, then the creation indexes it); it loses one when a creation under it is
rolled back. So a child of a child is indexed, or its entry tombstoned, under
the parent's session lock, the lock a release takes (``children_row``). A
row an earlier version left saying "no children" of a child that has some is
``fsck --repair``'s (``repair_has_children``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from .descriptor import ContinuableDescriptor, OneShotDescriptor
from .errors import CorruptSessionError, SessionNotFoundError, SubagentError
from .header import SessionHeader
from .index import IndexEntry, Settled, mark_active, mark_settled, read_index
from .index_writers import IndexWriters
from .lease_record import Lease
from .locks import PinnedLock
from .outcome import is_dropped_text, outcome_of
from .projection import Projection
from .reader import inspect, open_session, read_header
from .root import Store
from .session_file import SessionFile

__all__ = [
    "settled_row", "note_active", "note_settled", "children_row",
    "repair_has_children", "has_subagent_children", "row_problem",
]

log = logging.getLogger(__name__)


def settled_row(
    store: Store, header: SessionHeader, projection: Projection | None = None, file: SessionFile | None = None,
) -> Settled | None:
    """The row of a child no live owner holds, from its identity (or the fold of its whole log a
    writer holds, ``projection``); ``None`` when it would list as a diagnostic. ``file``: the
    session's file when the caller has it open (its log's start gives the row's ``end``, its
    ``fstat`` the row's ``mtime_ns``: a caller that is to write the row calls this after its last
    write to the file, or the row names a time the file no longer has and never lists fast)."""
    if file is None:
        with open_session(store, header.id) as opened:
            return settled_row(store, header, projection, opened)
    if projection is None:
        # imported here: identity reads logs (store/log.py), and the log writer may call into the
        # lease module, which imports this one
        from .identity import read_identity

        identity = read_identity(store, header.id, header.seed_length or 0, file, header=header)
        if identity.verdict is not None or identity.descriptor is None:
            return None
        projection = identity.projection
    elif not isinstance(projection.identity, (OneShotDescriptor, ContinuableDescriptor)):
        return None
    verdict = outcome_of(projection, held=False)
    has_children = has_subagent_children(store, header.id)
    return Settled(verdict.outcome, verdict.error_code, verdict.error, projection.last_ts, has_children,
                   file.data_start + projection.end_offset, os.fstat(file.fd).st_mtime_ns)


def _child_header(store: Store, session_id: str) -> SessionHeader | None:
    header = read_header(store, session_id)
    if header.parent_session is None or header.origin != "subagent":
        return None  # only subagent children have rows
    return header


def note_active(store: Store, session_id: str) -> None:
    """Under the session lock, before a lease is taken again: its row stops being ``settled``."""
    try:
        header = _child_header(store, session_id)
        if header is not None:
            mark_active(store, header.parent_session, session_id)  # type: ignore[arg-type]
    except (SubagentError, OSError) as exc:
        # an index that cannot be written cannot be read either (a listing then reads the
        # child's files); a header that does not decode lists the child as a diagnostic
        log.warning("no 'active' row for %s: %s", session_id, exc, extra={"session": session_id})


def note_settled(
    store: Store, file: SessionFile, *, header: SessionHeader | None = None, projection: Projection | None = None,
    writers: IndexWriters | None = None,
) -> None:
    """Under the session lock, right after a lease was written released: the row as it stands from now on.

    The release's write of the lease is the last write to the file before the row: the row's
    ``mtime_ns`` is the file's time after it (``settled_row``), which a listing compares.

    A caller that holds the session's log writer passes its ``header`` and ``projection`` (the fold
    of the whole log): the row then costs no read of the child's files but its own index. ``writers``
    appends the row through descriptors it keeps open (``store/index_writers.py``). ``file``: the
    session's file, open under that lock."""
    session_id = file.session_id
    try:
        if header is None:
            header = _child_header(store, session_id)
        elif header.parent_session is None or header.origin != "subagent":
            header = None
        row = None if header is None else settled_row(store, header, projection, file)
        if header is not None and row is not None:
            mark_settled(store, header.parent_session, session_id, row, writers=writers)  # type: ignore[arg-type]
    except (SubagentError, OSError) as exc:
        log.warning("no 'settled' row for %s: %s", session_id, exc, extra={"session": session_id})


def _settled_row_of(store: Store, session_id: str) -> tuple[str, Settled] | None:
    """Its parent and its ``settled`` row; ``None`` when its row is not ``settled`` or it has none."""
    header = _child_header(store, session_id)
    if header is None:
        return None
    parent = header.parent_session
    assert parent is not None
    entry = next((e for e in read_index(store, parent).entries if e.id == session_id), None)
    if entry is None or entry.settled is None:
        return None
    return parent, entry.settled


@contextmanager
def children_row(store: Store, parent: str, *, adding: bool, locked: bool = False) -> Iterator[Callable[[], None]]:
    """Around a change of ``parent``'s children index (``adding`` children, or tombstoning one a
    rolled-back creation listed): its own row stays true. Yields what to call once the change is made.

    For a parent that is itself a subagent child, the change runs under the parent's session lock
    (unless the caller holds it: ``locked``), the lock its release takes to write its ``settled`` row
    from its index: a release then comes wholly before the change or wholly after it.
    - After: the release reads the changed index.
    - Before: a ``settled`` row the change would make lie (no children, for an addition; some, for a
      removal) is marked ``active`` first, durably, and written again once the change is made, the
      same row but for ``has_children``, from the index then (its ``end`` and ``mtime_ns`` stay the
      release's: the change writes nothing to the parent's file). A kill between, or a change that
      fails, leaves the row ``active``, listed from the parent's files, which are right; a row marked
      so is never one that lies, to a listing or to ``check``.
    Without the lock, a creation that began while its parent was held and indexed its child after the
    parent settled left a row saying "no children" for good (found by ``check`` on a live run).

    A root, a fork, or a parent whose header does not read has no row: one header read, no lock. A
    held parent (a released lease comes before every ``settled`` row) costs the lock and a read of its
    lease; a settled one a read of its parent's index too, and two appends to it when the row changes.
    ``SessionNotFoundError`` for a parent gone before its lock was taken; ``LockTimeoutError`` past the
    lock's timeout (the caller's change fails, nothing written). A row that cannot be written is
    logged, as by ``note_active``: the change goes on."""
    try:
        header = _child_header(store, parent)
    except (SubagentError, OSError):
        header = None  # a damaged parent lists as a diagnostic; gone: the change says so
    if header is None:
        yield _nothing
        return
    lock = None
    if not locked:
        lock = PinnedLock(store.session_path(parent), create=False)
        try:
            lock.acquire()
        except FileNotFoundError:
            raise SessionNotFoundError(parent) from None
    try:
        row = None
        if _lease_released(store, parent):
            try:
                row = _settled_row_of(store, parent)
            except (SubagentError, OSError):
                row = None  # its parent's index does not read: the row is no claim ``check`` compares
        if row is None or row[1].has_children is not (not adding):
            yield _nothing  # held (its row is ``active``), or the change leaves its row true
            return
        grandparent, settled = row
        try:
            mark_active(store, grandparent, parent)
        except (SubagentError, OSError) as exc:
            log.warning("no 'active' row for %s before its children change: %s", parent, exc, extra={"session": parent})
            yield _nothing
            return
        yield lambda: _settle_again(store, grandparent, parent, settled)
    finally:
        if lock is not None:
            lock.release()


def _nothing() -> None:
    pass


def _lease_released(store: Store, session_id: str) -> bool:
    """Under the session's lock: whether its lease is released, or unreadable. A held lease was
    preceded by an ``active`` row (``note_active`` runs before a take): no read of its parent's index."""
    try:
        with open_session(store, session_id) as file:
            slots = file.read_slots()
    except (SubagentError, OSError):
        return True  # the index says what its row is
    return slots.problem is not None or slots.lease is None or slots.lease.state == "released"


def _settle_again(store: Store, parent: str, session_id: str, settled: Settled) -> None:
    """``children_row``'s second write: the ``settled`` row again, ``has_children`` from its index now."""
    try:
        mark_settled(store, parent, session_id, replace(settled, has_children=has_subagent_children(store, session_id)))
    except (SubagentError, OSError) as exc:
        log.warning("no 'settled' row for %s after its children changed: %s", session_id, exc, extra={"session": session_id})


def repair_has_children(store: Store, session_id: str) -> bool:
    """``fsck --repair``: under the session's lock, write its ``settled`` row again with ``has_children``
    true when the row says it has none while its index lists a subagent child (a child started under it
    once it had settled, by a version that left its row as it was). Whether a row was written."""
    try:
        lock = PinnedLock(store.session_path(session_id), create=False)
        lock.acquire()
    except FileNotFoundError:
        return False  # collected meanwhile
    try:
        row = _settled_row_of(store, session_id)
        if row is None or row[1].has_children is not False or not has_subagent_children(store, session_id):
            return False
        mark_settled(store, row[0], session_id, replace(row[1], has_children=True))
        return True
    finally:
        lock.release()


def has_subagent_children(store: Store, session_id: str) -> bool:
    """Whether the session's own index lists a subagent child: the ``has_children`` of its row."""
    # most sessions have no index of their own: one ``access`` says so without raising and catching
    # the ``FileNotFoundError`` a read would (a release pays this for every child)
    return os.access(store.children_index_path(session_id), os.F_OK) and any(
        e.origin == "subagent" for e in read_index(store, session_id).entries)


def row_problem(store: Store, entry: IndexEntry, header: SessionHeader, lease: Lease | None, lease_live: bool) -> str | None:
    """What in ``entry``'s row its child's files contradict, or ``None`` (``check``; the caller reads the lease).

    The static fields must be the identity's (mode, label); a ``settled`` row must not stand beside a
    lease a live owner holds, and must say what ``settled_row`` says from the log now."""
    if entry.origin != "subagent" or header.origin != "subagent":
        return None
    if entry.mode is not None:
        from .identity import read_identity  # see settled_row

        identity = read_identity(store, header.id, header.seed_length or 0)
        if identity.descriptor is None and identity.verdict == "corrupt":
            if inspect(store, header.id).status == "corrupt":
                # a corrupt log is reported with its session; without an identity cache (short logs
                # have none) the damage would otherwise read as a row naming the wrong identity too
                raise CorruptSessionError(header.id, "its log is corrupt")
            identity = read_identity(store, header.id, header.seed_length or 0)  # an append was in flight
        named = None if identity.descriptor is None else (identity.descriptor.mode, identity.descriptor.label)
        if named != (entry.mode, entry.label):
            return f"its index entry says mode {entry.mode!r}, label {entry.label!r}; its log says " + (
                f"mode {named[0]!r}, label {named[1]!r}" if named else "it has no valid descriptor")
    if entry.settled is None:
        return None
    if lease is not None and lease.state != "released" and lease_live:
        return f"its row says settled, but a live owner holds its lease (epoch {lease.epoch}, {lease.state})"
    now = settled_row(store, header)
    if now is not None:
        # the file's time is no claim about the child: a file written since its release only costs
        # listings a read of it, which its files answer (damage there is its session's finding)
        now = replace(now, mtime_ns=entry.settled.mtime_ns)
        if entry.settled.end is None:
            now = replace(now, end=None)  # a row an earlier build wrote says nothing of where the log ended
        if entry.settled.error is None and is_dropped_text(now.error):
            now = replace(now, error=None)  # ... nor what work was dropped unrun
    if now != entry.settled:
        fix = ""
        if now is not None and entry.settled.has_children is False and now == replace(entry.settled, has_children=True):
            # a child started under it once it had settled, by a version that left the row as it was
            fix = " (a child created under it since it settled; `subagents store fsck --repair` writes the row again)"
        return f"its settled row says {entry.settled}; its log says {now}{fix}"
    return None
