"""The derived parent → children index (``index/children/<parent-id>``): the catalog's rows.

Framed records (FORMAT.md §9): an entry ``{seq, id, created_at, origin}``
appended at creation, with the row's static fields (``mode``, ``label``, from
the creation's descriptor) when the creator knew them; a tombstone
``{seq, id, removed: true}`` when a creation is rolled back; and state records
written with the child's lease: ``active`` under the session lock of every
re-acquisition, ``settled`` (outcome, error, last activity) under the session
lock of every release (``store/lease.py``). A child whose latest state record
is ``settled`` is listed from this file alone; any other child from its own
files (``store/catalog.py``). Headers and logs are the authority: ``check``
compares every row with them, and ``reindex`` rebuilds every file from headers,
listing a child the old index lacks only when its use proves it was given out
(``store/acknowledgment.py``). Readers never write; a torn tail (a crash mid-append) reads as the
valid prefix.

A damaged record in the middle (bad bytes, or a CRC-valid record of the wrong
shape, checked by ``store/records.py``) is skipped and reading goes on with
the records after it (``framing.scan_all``): one bad record never drops the
children after it. ``read_index`` reports the skipped records, and the file
is then flagged for ``subagents store reindex`` (``fsck`` says so). The read side
(``read_index``, the entries) is ``store/index_read.py``; this module writes.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

from .acknowledgment import evidence_of_use
from .atomic import Removal, remove_durably, write_atomic
from .appender import append_durably, open_appendable
from .framing import encode_record
from .ids import is_valid_session_id
from .index_file import IndexFile, rebuilding
from .index_read import IndexEntry, IndexRead, Settled, read_children, read_index
from .header import SessionHeader
from .identity import read_identity
from .index_writers import IndexWriters
from .reader import read_header
from .errors import DurabilityError, ReadOnlyStoreError, SessionNotFoundError, SubagentError, UnavailableSessionError
from .root import Store
from .steps import Steps

__all__ = [
    "Settled", "IndexEntry", "IndexRead", "add_child", "add_children", "prepare_index", "remove_child", "drop_index", "mark_active", "mark_all_active", "mark_settled",
    "read_index", "read_children", "indexed_children", "children_from_headers", "ReindexReport", "reindex",
]

log = logging.getLogger(__name__)

# crash tests: ``reindex`` SIGKILLs itself right after its N-th change (``store/steps.py``)
KILL_AFTER_ENV = "SUBAGENTS_REINDEX_KILL_AFTER"


def _append(
    store: Store, parent_id: str, record: dict[str, Any] | list[dict[str, Any]], *, durable: bool = True,
    keep: Callable[[dict[str, Any]], bool] | None = None,
) -> None:
    # the index's own flock, blocking: many creators of one parent's children queue in the
    # kernel instead of polling (a 1-50 ms poll stalled waiters under load); rebuilds poll
    append_durably(store, store.children_index_path(parent_id), record, index=_index_file(store, parent_id),
                   key=f"index/children/{parent_id}", owner=parent_id, what=f"children index of {parent_id}",
                   skip_damage=True, durable=durable, keep=keep)


def _index_file(store: Store, parent_id: str) -> IndexFile:
    """``parent_id``'s index, not yet open (``IndexFile``: it is its own lock)."""
    key = f"index/children/{parent_id}"
    return IndexFile(store.children_index_path(parent_id), owner=parent_id, key=key, tails=store.index_tails)


def add_child(store: Store, parent_id: str, child_id: str, *, created_at: float, origin: str | None,
              mode: str | None = None, label: str | None = None) -> None:
    _append(store, parent_id, IndexEntry(child_id, created_at, origin, mode, label).creation_record())


def add_children(store: Store, parent_id: str, children: list[IndexEntry]) -> None:
    """``add_child`` for several children of one parent: one lock, one write, one fsync."""
    _append(store, parent_id, [c.creation_record() for c in children])


def prepare_index(store: Store, parent_id: str) -> None:
    """Create ``parent_id``'s children index, empty, if it has none: best effort.

    Made with every root (a root exists to delegate), so that its first child's creation adds one
    file, the child's own, like every later one. Not durable and not needed: when it is missing
    (a failure here, a crash, a ``reindex``), the first append creates it, and that append reports
    whatever keeps it from doing so.
    """
    try:
        fd, _ = open_appendable(store.children_index_path(parent_id), owner=parent_id, key=f"index/children/{parent_id}")
    # something in the way, no inode left, or a file another user owns: the first append reports it
    except (UnavailableSessionError, DurabilityError, ReadOnlyStoreError) as exc:
        log.debug("children index of %s not prepared: %s", parent_id, exc)
        return
    os.close(fd)


def remove_child(store: Store, parent_id: str, child_id: str, *, if_gone: bool = False) -> None:
    """Tombstone ``child_id``; ``if_gone``: only when its header does not exist (checked under the lock).

    A parent without an index lists no child: nothing to hide, and no index is made for it
    (an entry is appended only by the child's creator, which tombstones after its own append)."""
    if not os.path.lexists(store.children_index_path(parent_id)):
        return
    keep = (lambda record: not store.exists(record["id"])) if if_gone else None
    _append(store, parent_id, {"id": child_id, "removed": True}, keep=keep)


def drop_index(store: Store, parent_id: str, *, removal: Removal | None = None) -> bool:
    """Remove the index file of a parent that no longer exists; whether it did.

    For ``gc``, once ``parent_id`` and all of its children are in the trash. Checked under the
    index's lock: a parent re-created with the same id keeps its index, and an appender that
    waited for the lock finds the file it locked unlinked and appends to a new one
    (``store/index_file.py``). Durably (FORMAT.md §1, Removals), with ``removal`` when given
    (``gc`` settles one for all it removes) or at once: a session made right after takes the
    freed inode in ``sessions/``, and nothing else fsyncs ``index/children/``, so after a power
    loss the parent's index came back naming that session's file.
    """
    path = store.children_index_path(parent_id)
    if not os.path.lexists(path):
        return False
    with _index_file(store, parent_id):
        if store.exists(parent_id):
            return False
        try:
            if removal is not None:
                removed = removal.remove(path)
            else:
                removed = remove_durably([path], durable=store.durability.syncs_at_commit) == 1
        except FileNotFoundError:
            return False
        if removed:
            store.index_tails.pop(f"index/children/{parent_id}", None)
        return removed


def mark_active(store: Store, parent_id: str, child_id: str) -> None:
    """An ``active`` state record: the child's lease is being taken again, so a ``settled`` row before
    it no longer holds. Durable: after a machine crash a lost ``active`` would let an older
    ``settled`` row stand for a log that went on (the lease taken beside it is durable)."""
    _append(store, parent_id, {"id": child_id, "state": "active"})


def mark_all_active(store: Store, parent_id: str, child_ids: list[str]) -> None:
    """``mark_active`` for several children of one parent in one durable write: ``gc`` clears the
    ``settled`` rows of children it is about to remove, so that a gc killed between removing a
    child and dropping this index never leaves a row that lists a removed child as settled."""
    _append(store, parent_id, [{"id": child, "state": "active"} for child in child_ids])


def mark_settled(store: Store, parent_id: str, child_id: str, settled: Settled, *, writers: IndexWriters | None = None) -> None:
    """A ``settled`` state record. Not fsync'd: losing it in a crash only sends the next listing
    back to the child's own files, which are the authority. ``writers``: appended through the
    descriptors it keeps open (a worker settling many children of one parent)."""
    record = {"id": child_id, "state": "settled", **settled.to_record()}
    if writers is None:
        _append(store, parent_id, record, durable=False)
    else:
        writers.append(parent_id, [record], durable=False)


def _static_fields(store: Store, header: SessionHeader) -> tuple[str | None, str | None]:
    """``(mode, label)`` of a subagent child from its identity; ``(None, None)`` when it does not read as one."""
    if header.origin != "subagent":
        return None, None
    try:
        descriptor = read_identity(store, header.id, header.seed_length or 0).descriptor
    except (SubagentError, OSError):
        return None, None  # listed from its files, which say what is wrong
    return (None, None) if descriptor is None else (descriptor.mode, descriptor.label)


def indexed_children(store: Store) -> set[str]:
    """Every id some children index lists as live, whatever its parent: for ``gc``, which must know
    whether a session whose header does not read has a known place (read-only; damage is skipped)."""
    try:
        names = os.listdir(store.children_index_dir)
    except OSError:
        return set()
    return {e.id for name in names if is_valid_session_id(name) for e in read_children(store, name)}


@dataclass(frozen=True)
class ReindexReport:
    """What ``reindex`` wrote, and what it decided for each child its headers prove but the index it
    replaced did not list (``store/acknowledgment.py``). Every map is parent → child ids in
    (created_at, id) order; a parent with nothing to report is absent."""

    parents: dict[str, list[str]]  # every rebuilt index: its children, in order
    # absent from the index, listed again: a use proves someone had the id (or the index was
    # damaged, and a skipped record may have listed it)
    put_back: dict[str, list[str]]
    # absent from the index and never used: a creation nobody was told of, left unlisted
    left_out: dict[str, list[str]]
    # the same, listed anyway (``keep_unacknowledged``)
    kept_unacknowledged: dict[str, list[str]]

    @property
    def children(self) -> int:
        return sum(len(ids) for ids in self.parents.values())

    def to_dict(self) -> dict[str, Any]:
        return {"parents": self.parents, "children": self.children, "put_back": self.put_back, "left_out": self.left_out,
                "kept_unacknowledged": self.kept_unacknowledged}


@dataclass
class _Rebuild:
    """One parent's new index, decided under its lock."""

    entries: list[IndexEntry] = field(default_factory=list)
    put_back: list[IndexEntry] = field(default_factory=list)
    left_out: list[IndexEntry] = field(default_factory=list)
    kept_unacknowledged: list[IndexEntry] = field(default_factory=list)


def reindex(store: Store, *, keep_unacknowledged: bool = False) -> ReindexReport:
    """Rebuild every index file from headers and the index it replaces.

    A child its header proves is listed when the current index lists it, or when something shows
    it was used (``evidence_of_use``): its entry was lost, and its use proves someone was given its
    id. A child never used that the index does not list is a creation whose creator died before
    appending its entry, which therefore never returned the id: it is left out (and reported)
    unless ``keep_unacknowledged``. A damaged index (a record skipped) may have listed any child,
    so all of its parent's proven children are kept.

    Each index is read again under its lock, just before it is replaced: an entry a creator
    appended after the headers were read (its header published after the scan) is kept when its
    header names this parent, and a creation still between its two steps is judged on what the
    index says then (an append after the replacement lands in the new file).

    A subagent child's entry gets its row's static fields (mode, label) from its identity, when
    that reads as a valid descriptor; state records are not rebuilt (each child's next release
    writes its ``settled`` row again; until then it is listed from its files).

    A session whose header does not read keeps the entry the old index gave it (without its
    state records): that entry is all that still says where it belongs, and it keeps the
    damaged session listed, as a diagnostic, until its file is restored or removed."""
    proven: dict[str, dict[str, IndexEntry]] = defaultdict(dict)
    unreadable: set[str] = set()
    for session_id, header in _headers(store):
        if header is None:
            unreadable.add(session_id)  # proves nothing, and is not to be lost either (below)
        elif header.parent_session is not None:
            proven[header.parent_session][header.id] = _entry_of(store, header)
    parents = set(proven) | {name for name in os.listdir(store.children_index_dir) if is_valid_session_id(name)}
    # every index it rewrites, before the first: one it may not write (another user's), or a folder in
    # an index's place (the roots index too, which ``rebuild_roots`` rewrites next), would stop it halfway
    indexes = [store.children_index_path(parent_id) for parent_id in parents]
    store.require_index_files(*indexes, store.roots_index_path)
    store.require_writable(*indexes)
    report = ReindexReport({}, {}, {}, {})
    steps = Steps(KILL_AFTER_ENV)
    for parent_id in sorted(parents):
        with rebuilding(_index_file(store, parent_id)):
            rebuilt = _rebuild(store, parent_id, proven.get(parent_id, {}), read_index(store, parent_id),
                               unreadable=unreadable, parents=set(proven), keep_unacknowledged=keep_unacknowledged)
            if rebuilt.entries:
                blob = b"".join(encode_record({"seq": i, **e.creation_record()}) for i, e in enumerate(rebuilt.entries))
                write_atomic(store.children_index_path(parent_id), blob, durable=store.durability.syncs_at_commit)
            else:  # durably: a name that came back after a power loss could name a file made since
                remove_durably([store.children_index_path(parent_id)], durable=store.durability.syncs_at_commit)
            store.index_tails.pop(f"index/children/{parent_id}", None)
        steps.done()
        for into, entries in ((report.parents, rebuilt.entries), (report.put_back, rebuilt.put_back),
                              (report.left_out, rebuilt.left_out), (report.kept_unacknowledged, rebuilt.kept_unacknowledged)):
            if entries:
                into[parent_id] = [e.id for e in entries]
    for what, decided in (("put back", report.put_back), ("left out (never acknowledged)", report.left_out),
                          ("kept (never acknowledged)", report.kept_unacknowledged)):
        for parent_id, children in decided.items():
            log.info("reindex: children of %s %s: %s", parent_id, what, ", ".join(children))
    return report


def _headers(store: Store) -> Iterator[tuple[str, SessionHeader | None]]:
    """Every session's header (``None``: it does not read): the authority every index derives from."""
    for session_id in store.session_ids():
        try:
            yield session_id, read_header(store, session_id)
        except SubagentError:
            yield session_id, None


def children_from_headers(store: Store, parent_id: str) -> list[IndexEntry]:
    """The entries of the children whose headers name ``parent_id``, from a scan of every header:
    what a listing reads beside an index that is damaged (any entry may be lost), until a reindex."""
    return [_entry_of(store, header) for _, header in _headers(store) if header is not None and header.parent_session == parent_id]


def _entry_of(store: Store, header: SessionHeader) -> IndexEntry:
    mode, label = _static_fields(store, header)
    return IndexEntry(header.id, header.created_at, header.origin, mode, label)


def _rebuild(store: Store, parent_id: str, proven: dict[str, IndexEntry], current: IndexRead, *, unreadable: set[str],
             parents: set[str], keep_unacknowledged: bool) -> _Rebuild:
    """``parent_id``'s new entries from its proven children and its ``current`` index (read under its lock)."""
    listed = {e.id: e for e in current.entries}
    out = _Rebuild()
    for child, entry in proven.items():
        if child in listed:
            out.entries.append(entry)
        elif not store.exists(child):
            continue  # rolled back since the scan (its file goes before its tombstone)
        elif current.needs_reindex or evidence_of_use(store, child, has_children=child in parents) is not None:
            out.entries.append(entry)
            out.put_back.append(entry)
        elif keep_unacknowledged:
            out.entries.append(entry)
            out.kept_unacknowledged.append(entry)
        else:
            out.left_out.append(entry)
    for child, entry in listed.items():
        if child in proven:
            continue
        if child in unreadable:
            out.entries.append(replace(entry, settled=None))
            continue
        try:  # not seen by the scan: a creation since, whose header decides
            header = read_header(store, child)
        except SessionNotFoundError:
            continue  # no header proves it: dropped
        except SubagentError:
            out.entries.append(replace(entry, settled=None))  # kept as one unreadable at the scan is
            continue
        if header.parent_session == parent_id:
            out.entries.append(_entry_of(store, header))
    for entries in (out.entries, out.put_back, out.left_out, out.kept_unacknowledged):
        entries.sort(key=lambda e: (e.created_at, e.id))
    return out
