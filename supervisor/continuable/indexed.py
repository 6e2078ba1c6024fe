"""What a parent's children index says of the children a drain names: listed under it or not, and
continuable or one-shot (``teardown.py``).

Answered from the store's kept fold of the index (``store/committed.py``), which reads only the records
appended since its last read: a drain of one child of a parent with thousands decoded every record of
the index, once per drain and once more per diagnostic row (~25 µs and ~1.4 KB a child the parent ever
had, per drain: found by a probe). An index that does not read clean is read as a listing reads it.
"""

from __future__ import annotations

from subagents.store import Store, read_projection
from subagents.store.catalog import listed_children
from subagents.store.committed import listed_rows
from subagents.store.errors import SubagentError
from subagents.store.index_read import Listed

__all__ = ["listed", "continuable", "indexed_mode"]


def listed(store: Store, parent_id: str, child_ids: list[str]) -> dict[str, Listed]:
    """Which of ``child_ids`` the parent's children index lists, with each one's origin and mode: from the
    store's kept fold of that index, read on from where its last read stopped (a drain of one child of a
    parent with thousands decoded every record of the index, each time: found by a probe); an index that
    does not read clean as a listing reads it (``listed_children``: logged, and read beside headers)."""
    kept = listed_rows(store, parent_id, child_ids)
    if kept is not None:
        return kept
    wanted = set(child_ids)
    return {e.id: Listed(e.origin == "subagent", e.mode) for e in listed_children(store, parent_id) if e.id in wanted}


def continuable(store: Store, child_id: str, entry: Listed) -> bool:
    """Whether an indexed child is continuable: its index entry's mode, else its log's descriptor (a log
    that does not read is no child a drain can tell continuable: skipped, as its listing row would be)."""
    if entry.mode is not None:
        return entry.mode == "continuable"
    try:
        return read_projection(store, child_id).continuable() is not None
    except SubagentError:
        return False


def indexed_mode(store: Store, parent_id: str, child_id: str) -> str | None:
    """The mode the parent's children index recorded for the child at its creation (None: not recorded)."""
    entry = listed(store, parent_id, [child_id]).get(child_id)
    return None if entry is None else entry.mode
