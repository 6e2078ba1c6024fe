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
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace

from .descriptor import ContinuableDescriptor, OneShotDescriptor
from .errors import CorruptSessionError, SubagentError
from .header import SessionHeader
from .index import IndexEntry, Settled, mark_active, mark_settled, read_index
from .index_writers import IndexWriters
from .lease_record import Lease
from .outcome import is_dropped_text, outcome_of
from .projection import Projection
from .reader import inspect, open_session, read_header
from .root import Store
from .session_file import SessionFile

__all__ = ["settled_row", "note_active", "note_settled", "row_problem"]

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

        identity = read_identity(store, header.id, header.seed_length or 0, file)
        if identity.verdict is not None or identity.descriptor is None:
            return None
        projection = identity.projection
    elif not isinstance(projection.identity, (OneShotDescriptor, ContinuableDescriptor)):
        return None
    verdict = outcome_of(projection, held=False)
    # most children have no index of their own: one ``access`` says so without raising and catching
    # the ``FileNotFoundError`` a read would (a release pays this for every child)
    has_children = os.access(store.children_index_path(header.id), os.F_OK) and any(
        e.origin == "subagent" for e in read_index(store, header.id).entries)
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
        return f"its settled row says {entry.settled}; its log says {now}"
    return None
