"""Catalog queries: a parent's children and a root's descendants, with diagnostics.

Cost is O(number of children), and for a settled child one ``lstat`` of its
file: the children index holds each child's row (``store/index.py``, FORMAT.md
§9). A child whose creation record carries the row's static fields and whose
latest state record is ``settled`` is listed from the index alone, once the
``lstat`` shows its file still as long as the row's ``end`` and still with
the modification time the release left (``mtime_ns``). A shorter file lost
committed records: the child is read, and listed as damaged. A file written
since (its time moved: bytes overwritten in place behind the store's back,
or any write the row does not know of) is read, its whole log folded (its
identity cache vouches only for bytes its writer left), and listed as its
files say: a diagnostic when they are damaged, else its current row — a
changed time alone is no damage. A ``settled`` record without ``has_children`` adds a
read of its own index; one without ``mtime_ns`` (an older build) is taken on
type and length alone. Any other child — one that may be running, or one
indexed by an older build — costs its header,
its identity cache and its lease (plus its owner's heartbeat, read once per
owner per query), and a continuable one the messages its log has not
consumed (O(pending): ``mailbox.require_consumed_prefix``, so a mailbox whose
accepted messages are damaged makes the row a diagnostic); only a child whose
cache is missing or behind its gate has its log folded, in memory. A listing never writes a byte and never loads,
resumes or repairs anything.

Rules (the reference's, with this project's statuses; docs/behaviour.md, "Catalog"):
* only a child whose header proves it (``parent_session`` == parent,
  ``origin == "subagent"``) is a candidate; plain forks are walked by
  ``list_descendants`` but never listed. A row from the index is the
  creator's word for its header: the creator appends it only after the header
  is durable, and a rollback tombstones it; a row that lies while its file
  keeps the size and time the row names (an index edited by hand, a change
  within the file system's timestamp granularity of the release) is a
  finding of ``check``, not of every listing;
* one bad child yields a ``DiagnosticEntry`` (``corrupt``, ``unsupported``,
  ``unavailable``) and never hides its siblings;
* ``status`` is ``running`` / ``idle`` from a live owner's lease, else
  ``complete``: true across processes (a ``settled`` row is written under
  the session lock of the release, and a re-acquisition appends ``active``
  under the same lock before it takes the lease: ``store/rows.py``);
  ``outcome`` beside it says how the child's last turn ended
  (``store/outcome.py``), with the error's code and first line for a failure.

Each row that reads a child's files is built inside one guard (``_entry``):
whatever a child's files hold — wrong types, a folder or a link in place of a
file, a damaged lease or index — becomes that child's ``DiagnosticEntry``,
never an exception out of the listing (a settled row ``list_children`` takes
from a clean index, ``_indexed_entry``, reads nothing but the checked row and
one ``lstat``, whose failure sends it to the guard). A failure the guard does not expect is logged with its traceback
(it is a bug) and still becomes a diagnostic: the listing is an isolation
boundary between sessions.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field, replace
from typing import Literal


from .errors import SessionNotFoundError, SubagentError, UnsupportedFormatError
from .identity import DiagnosticReason, Identity, read_identity
from .ids import validate_session_id
from .index import IndexEntry, children_from_headers, read_index
from .index_read import IndexRow, entry_of, read_clean_rows
from .lease import Lease, OwnerCache, lease_of
from .mailbox import require_consumed_prefix
from .outcome import OUTCOMES, Outcome, outcome_of
from .projection import Projection
from .query import Query, check_query
from .reader import header_of, open_session
from .root import Store
from .session_file import HEADER_AT

__all__ = [
    "ChildStatus", "DiagnosticReason", "ChildEntry", "DiagnosticEntry", "damage_reason", "DescendantRow", "Identity", "listed_children",
    "read_identity", "list_children", "list_descendants",
]

ChildStatus = Literal["running", "idle", "complete"]
Since = Literal["unchanged", "written", "cut"]  # a settled child's file since its row was written (``_since_settled``)
_MODES = ("one-shot", "continuable")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChildEntry:
    id: str
    label: str | None
    mode: Literal["one-shot", "continuable"]
    status: ChildStatus
    has_children: bool
    outcome: Outcome | None = None  # how its last turn ended (store/outcome.py); None: none finished yet
    error_code: str | None = None  # for a failure: the diagnostic's leading code, when it has one
    error: str | None = None  # for a failure: the diagnostic's first line
    created_at: float = 0.0  # the header's creation time (seconds since the epoch)
    node: str | None = None  # where its open turn runs (``host:pid``; on Ray ``ip/node:pid``), while a live owner holds it
    kind: Literal["child"] = "child"


@dataclass(frozen=True)
class DiagnosticEntry:
    id: str
    reason: DiagnosticReason
    # the creation time its index entry records (its own header may not read): a listing sorted by
    # creation keeps the row where the child was made, not first. Not part of what the row says
    # (equality): a diagnostic is its id and its reason
    created_at: float = field(default=0.0, compare=False)
    kind: Literal["diagnostic"] = "diagnostic"


@dataclass(frozen=True)
class DescendantRow:
    entry: ChildEntry | DiagnosticEntry
    parent_id: str
    depth: int


def _has_subagent_children(children: list[IndexEntry]) -> bool:
    return any(e.origin == "subagent" for e in children)


def listed_children(store: Store, parent_id: str) -> list[IndexEntry]:
    """The entries a listing lists from (not ``index.indexed_children``, every id any index lists): the
    index entries; a damaged index is logged (``fsck`` flags it for reindex) and read past, and
    the children whose headers name the parent are read beside it (a scan of every header, until a
    reindex): the entries its damage hid would otherwise drop out of every listing."""
    found = read_index(store, parent_id)
    if not found.problems:
        return found.entries
    for problem in found.problems:
        log.warning("children index of %s: %s (run `subagents store reindex`)", parent_id, problem, extra={"session": parent_id})
    listed = {entry.id for entry in found.entries}
    hidden = [entry for entry in children_from_headers(store, parent_id) if entry.id not in listed]
    return sorted([*found.entries, *hidden], key=lambda entry: (entry.created_at, entry.id)) if hidden else found.entries


def _entry(
    store: Store, parent_id: str, indexed: IndexEntry, owners: OwnerCache, children: list[IndexEntry] | None = None
) -> ChildEntry | DiagnosticEntry | None:
    """The row for one indexed child, or ``None`` when its header does not prove it a subagent child.

    ``children`` is the child's own index when the caller has read it already (one read per node).
    Never raises: this is the guard that keeps one child's damage in its own row.
    """
    row = _entry_or_damage(store, parent_id, indexed, owners, children)
    return replace(row, created_at=indexed.created_at) if isinstance(row, DiagnosticEntry) else row


def _entry_or_damage(
    store: Store, parent_id: str, indexed: IndexEntry, owners: OwnerCache, children: list[IndexEntry] | None
) -> ChildEntry | DiagnosticEntry | None:
    child_id = indexed.id
    try:
        settled = _settled_row(store, indexed, children)
        since = None if settled is None else _since_settled(store, indexed)
        if settled is not None and since == "unchanged":
            return settled
        # a file written since it settled was written by none of the store's writers: the identity
        # cache vouches for its bytes only as its writer left them, so its whole log is folded
        committed_end = indexed.settled.end if since == "written" and indexed.settled is not None else None
        row = _row(store, parent_id, child_id, owners, children, whole=since == "written", committed_end=committed_end)
        if since == "cut" and isinstance(row, ChildEntry):
            # its file lost bytes the row was written from: the file is the authority, and a
            # row read from a log cut short of its records is damage, whatever else it says
            return DiagnosticEntry(child_id, "corrupt")
        return row  # written since it settled (damaged in place, or a write the row does not know): its files say
    except SessionNotFoundError:
        return None  # a rolled-back or never-published creation
    except Exception as exc:
        return DiagnosticEntry(child_id, damage_reason(exc, child_id))


def damage_reason(exc: Exception, session_id: str) -> DiagnosticReason:
    """What a listing row says when reading a session raised ``exc`` (``SessionNotFoundError`` is
    the caller's: a session that is gone is no row at all)."""
    if isinstance(exc, UnsupportedFormatError):
        return "unsupported"
    if isinstance(exc, OSError):  # UnavailableSessionError too: a file that cannot be read at all
        return "unavailable"
    if isinstance(exc, SubagentError):  # CorruptSessionError, a descriptor or a header that breaks the rules
        return "corrupt"
    # a bug, not damage: logged with its traceback, and still confined to this row
    log.error("listing row of %s failed", session_id, exc_info=exc, extra={"session": session_id})
    return "unavailable"


def _settled_row(store: Store, indexed: IndexEntry, children: list[IndexEntry] | None) -> ChildEntry | None:
    """The row from the index alone, when the child is settled and its entry carries the static fields."""
    settled = indexed.settled
    if settled is None or indexed.origin != "subagent" or not _row_speaks(indexed.mode, settled.outcome):
        return None
    return ChildEntry(
        id=indexed.id,
        label=indexed.label,
        mode=indexed.mode,  # type: ignore[arg-type]
        status="complete",
        has_children=settled.has_children if settled.has_children is not None and children is None
        else _has_subagent_children(listed_children(store, indexed.id) if children is None else children),
        outcome=settled.outcome,  # type: ignore[arg-type]
        error_code=settled.error_code,
        error=settled.error,
        created_at=indexed.created_at,
    )


def _row_speaks(mode: str | None, outcome: str | None) -> bool:
    """Whether a settled row says all a listing shows: its mode recorded, its outcome one this build knows
    (else the child's files say)."""
    return mode in _MODES and (outcome is None or outcome in OUTCOMES)


def _since_settled(store: Store, indexed: IndexEntry) -> Since:
    """What one ``lstat`` of the child's file says of its ``settled`` row.

    ``cut``: not a regular file, or shorter than the end of the log's records then (a row without
    ``end``: too short for a header), i.e. it lost bytes the row was written from. ``written``: its
    modification time is not the one the release left (``mtime_ns``), so something wrote it since
    — bytes overwritten in place behind the store's back, or a write the row does not know of; its
    files say which. ``unchanged``: the row stands (a row without ``mtime_ns`` cannot tell a file
    written since from one that was not)."""
    settled = indexed.settled
    return _since(store, indexed.id, None if settled is None else settled.end, None if settled is None else settled.mtime_ns)


def _since(store: Store, child_id: str, end: int | None, mtime_ns: int | None) -> Since:
    """``_since_settled`` of a row's ``end`` and ``mtime_ns``."""
    try:
        info = os.lstat(store.session_path(child_id))
    except OSError:
        return "cut"
    if not stat.S_ISREG(info.st_mode) or info.st_size < (HEADER_AT if end is None else max(end, HEADER_AT)):
        return "cut"
    if mtime_ns is not None and info.st_mtime_ns != mtime_ns:
        return "written"
    return "unchanged"


def _row(
    store: Store, parent_id: str, child_id: str, owners: OwnerCache, children: list[IndexEntry] | None, *,
    whole: bool = False, committed_end: int | None = None,
) -> ChildEntry | DiagnosticEntry | None:
    """The row from the child's own files; ``whole``: its log folded whole, its identity cache unused.
    ``committed_end``: where its ``settled`` row says the log's records ended; a log whose valid records
    end before it lost committed ones (its last ``turn/end`` damaged in place reads like a torn tail)."""
    with open_session(store, child_id) as file:  # header, log and lease through one descriptor
        header = header_of(file)
        if header.parent_session != parent_id or header.origin != "subagent":
            return None
        identity = read_identity(store, child_id, header.seed_length or 0, file, use_cache=not whole, header=header)
        if identity.verdict == "corrupt":
            # an append in flight can read as damage to a reader without the lock (``reader.inspect``,
            # ``confirm``): read again under it, taken on this descriptor only now, before saying so
            file.lock(bounded=True)
            try:
                identity = read_identity(store, child_id, header.seed_length or 0, file, use_cache=not whole, header=header)
            finally:
                file.unlock()
        if identity.verdict is not None:
            return DiagnosticEntry(child_id, identity.verdict)
        if committed_end is not None and file.data_start + identity.projection.end_offset < committed_end:
            return DiagnosticEntry(child_id, "corrupt")
        descriptor = identity.descriptor
        if descriptor is None:
            return DiagnosticEntry(child_id, "corrupt")
        if descriptor.mode == "continuable":
            # messages sent to it and not yet taken by a turn: damage there (no torn tail) may have lost
            # some, and refuses every acceptance (CorruptSessionError: the row is a diagnostic)
            require_consumed_prefix(store, child_id, identity.projection)
        status = _status(lease_of(file), owners)
    verdict = outcome_of(identity.projection, held=status != "complete")
    return ChildEntry(
        id=child_id,
        label=descriptor.label,
        mode=descriptor.mode,
        status=status,
        has_children=_has_subagent_children(listed_children(store, child_id) if children is None else children),
        outcome=verdict.outcome,
        error_code=verdict.error_code,
        error=verdict.error,
        created_at=header.created_at,
        node=running_node(identity.projection, held=status != "complete"),
    )


def running_node(projection: Projection, *, held: bool) -> str | None:
    """Where the session's open turn runs, while a live owner holds it (a crashed turn runs nowhere)."""
    return projection.open_node if held and projection.open_turn is not None else None


def _status(lease: Lease | None, owners: OwnerCache) -> ChildStatus:
    """``session_status`` of a lease read with ``lease_of``, which lets a damaged lease raise (the row becomes a diagnostic)."""
    if lease is None or not owners.holds(lease):
        return "complete"
    return "idle" if lease.state == "idle" else "running"


def list_children(store: Store, parent_id: str, query: Query | None = None) -> list[ChildEntry | DiagnosticEntry]:
    """Direct subagent children of ``parent_id`` in (created_at, id) order; ``query`` keeps only the matching
    rows (store/query.py; a diagnostic row matches only an empty query)."""
    validate_session_id(parent_id)
    check_query(query)
    owners = OwnerCache(store)
    clean = read_clean_rows(store, parent_id)
    rows = (
        (_entry(store, parent_id, indexed, owners) for indexed in listed_children(store, parent_id) if indexed.origin == "subagent")
        if clean is None  # a damaged index: read past, and the headers read beside it (``listed_children``)
        else (_indexed_entry(store, parent_id, indexed, owners) for indexed in clean if indexed[2] == "subagent")
    )
    return [row for row in rows if row is not None and (query is None or query.matches(row))]


def _indexed_entry(store: Store, parent_id: str, indexed: IndexRow, owners: OwnerCache) -> ChildEntry | DiagnosticEntry | None:
    """``_entry`` of a child as a clean read of its parent's index holds it: a settled child that
    ``_settled_row`` would list from its row and whose file the ``lstat`` finds unchanged is listed
    from the row's fields, without the ``IndexEntry`` and ``Settled`` made of them first (two objects
    of the few a settled child's row costs, a tenth of a listing's time); any other as ``_entry``."""
    child, created_at, _origin, mode, label, settled, _committed_end = indexed
    if settled is not None:
        outcome, error_code, error, _last_at, has_children, end, mtime_ns = settled
        if has_children is not None and _row_speaks(mode, outcome) and _since(store, child, end, mtime_ns) == "unchanged":
            return ChildEntry(child, label, mode, "complete", has_children, outcome, error_code, error,  # type: ignore[arg-type]
                              created_at)
    return _entry(store, parent_id, entry_of(indexed), owners)


def list_descendants(store: Store, root_id: str, query: Query | None = None) -> list[DescendantRow]:
    """Every subagent below ``root_id`` in pre-order, through non-subagent sessions; cycle-safe.

    ``query`` keeps only the matching rows; the walk still goes through the others
    (a matching grandchild below a parent that does not match is listed)."""
    validate_session_id(root_id)
    check_query(query)
    owners = OwnerCache(store)
    rows: list[DescendantRow] = []
    visited = {root_id}
    stack: list[tuple[IndexEntry, str, int]] = [
        (e, root_id, 1) for e in reversed(listed_children(store, root_id))
    ]
    while stack:
        indexed, parent, depth = stack.pop()
        node = indexed.id
        if node in visited:
            continue
        visited.add(node)
        below = listed_children(store, node)
        row = _entry(store, parent, indexed, owners, below)
        if row is not None and (query is None or query.matches(row)):
            rows.append(DescendantRow(row, parent, depth))
        for child in reversed(below):
            if child.id not in visited:
                stack.append((child, node, depth + 1))
    return rows
