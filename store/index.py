"""The derived parent → children index (``index/children/<parent-id>``).

Framed records ``{seq, id, created_at, origin}`` appended at creation, and a
tombstone ``{seq, id, removed: true}`` when a creation is rolled back. Headers
are the authority: the catalog checks every entry against the child's header,
and ``reindex`` rebuilds every file from headers alone. Readers never write;
a torn tail (a crash mid-append) reads as the valid prefix.

A damaged record in the middle (bad bytes, or a CRC-valid record of the wrong
shape, checked by ``store/records.py``) is skipped and reading goes on with
the records after it (``framing.scan_all``): one bad record never drops the
children after it. ``read_index`` reports the skipped records, and the file
is then flagged for ``subagents store reindex`` (``fsck`` says so).
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from .atomic import read_bytes, write_atomic
from .appender import append_durably
from .framing import encode_record, scan_all
from .ids import is_valid_session_id
from .locks import file_lock
from .reader import read_header
from .records import IndexFields, problem_of
from .errors import SubagentError
from .root import Store

__all__ = ["IndexEntry", "IndexRead", "add_child", "add_children", "remove_child", "read_index", "read_children", "reindex"]

_problem = problem_of(IndexFields)


@dataclass(frozen=True)
class IndexEntry:
    id: str
    created_at: float
    origin: str | None


@dataclass(frozen=True)
class IndexRead:
    """One read of a parent's index file: its live entries and what was wrong with it."""

    entries: list[IndexEntry]
    problems: list[str]  # each a skipped record or an unreadable file; non-empty → run reindex

    @property
    def needs_reindex(self) -> bool:
        return bool(self.problems)


def _append(store: Store, parent_id: str, record: dict[str, Any] | list[dict[str, Any]]) -> None:
    # a blocking flock, not filelock: many creators of one parent's children queue
    # in the kernel instead of polling (filelock's poll stalled waiters under load)
    path = store.children_index_path(parent_id)
    append_durably(store, path, record, lock_path=path + ".lock", key=f"index/children/{parent_id}", owner=parent_id,
                   what=f"children index of {parent_id}", skip_damage=True)


def add_child(store: Store, parent_id: str, child_id: str, *, created_at: float, origin: str | None) -> None:
    _append(store, parent_id, {"id": child_id, "created_at": created_at, "origin": origin})


def add_children(store: Store, parent_id: str, children: list[IndexEntry]) -> None:
    """``add_child`` for several children of one parent: one lock, one write, one fsync."""
    _append(store, parent_id, [{"id": c.id, "created_at": c.created_at, "origin": c.origin} for c in children])


def remove_child(store: Store, parent_id: str, child_id: str) -> None:
    _append(store, parent_id, {"id": child_id, "removed": True})


def read_index(store: Store, parent_id: str) -> IndexRead:
    """Live entries in (created_at, id) order and the problems met; read-only, never raises for damage."""
    try:
        data = read_bytes(store.children_index_path(parent_id))
    except FileNotFoundError:
        return IndexRead([], [])
    except OSError as exc:
        return IndexRead([], [f"the index file cannot be read ({exc.strerror or exc})"])
    skim = scan_all(data, check=_problem)
    problems = [
        f"record(s) {s.seqs.start}..{s.seqs.stop - 1} skipped: {s.damage.reason} at byte {s.damage.offset}"
        + (f" ({s.damage.detail})" if s.damage.detail else "")
        for s in skim.skipped
    ]
    if data and not skim.records and skim.tail is not None:
        # a torn tail leaves the records before it; a file with none is not an index at all
        problems.append(f"no readable record: {skim.tail.reason} at byte {skim.tail.offset}")
    entries: dict[str, IndexEntry] = {}
    for record in skim.records:
        child = record["id"]
        if not is_valid_session_id(child):
            continue
        if record.get("removed"):
            entries.pop(child, None)
        elif child not in entries:
            entries[child] = IndexEntry(child, float(record.get("created_at", 0.0)), record.get("origin"))
    return IndexRead(sorted(entries.values(), key=lambda e: (e.created_at, e.id)), problems)


def read_children(store: Store, parent_id: str) -> list[IndexEntry]:
    """Live entries in (created_at, id) order; read-only (damage: see ``read_index``)."""
    return read_index(store, parent_id).entries


def reindex(store: Store) -> dict[str, list[str]]:
    """Rebuild every index file from headers; returns parent → child ids in order."""
    groups: dict[str, list[IndexEntry]] = defaultdict(list)
    for session_id in store.session_ids():
        try:
            header = read_header(store, session_id)
        except SubagentError:
            continue  # an unreadable header proves nothing
        if header.parent_session is not None:
            groups[header.parent_session].append(IndexEntry(header.id, header.created_at, header.origin))
    result: dict[str, list[str]] = {}
    for parent_id, entries in groups.items():
        entries.sort(key=lambda e: (e.created_at, e.id))
        blob = b"".join(
            encode_record({"seq": i, "id": e.id, "created_at": e.created_at, "origin": e.origin}) for i, e in enumerate(entries)
        )
        with file_lock(store.children_index_path(parent_id) + ".lock"):
            write_atomic(store.children_index_path(parent_id), blob, durable=store.durability.syncs_at_commit)
            store.index_tails.pop(f"index/children/{parent_id}", None)
        result[parent_id] = [e.id for e in entries]
    for name in os.listdir(store.children_index_dir):
        if is_valid_session_id(name) and name not in groups:
            with file_lock(store.children_index_path(name) + ".lock"):
                os.unlink(store.children_index_path(name))
    return result
