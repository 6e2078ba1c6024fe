"""Top-level sessions: the roots of a store, for listings that start from nothing.

A root is a session whose header names no ``parent_session``. Finding them
costs one header read per session in the store (there is no index of roots
yet), plus one lease read per root; it never writes a byte. An unreadable
header is skipped here: ``store fsck`` is the place that reports it.
Called by the CLI (``ls`` and ``tree`` without an id) and anyone listing a store.
"""

from __future__ import annotations

from dataclasses import dataclass

from .catalog import ChildStatus
from .errors import SubagentError
from .index import read_children
from .lease import OwnerCache, session_status
from .reader import read_header
from .root import Store

__all__ = ["RootEntry", "list_roots", "subagent_count"]


@dataclass(frozen=True)
class RootEntry:
    id: str
    label: str | None
    created_at: float
    status: ChildStatus
    children: int  # direct subagent children, per the index


def subagent_count(store: Store, session_id: str) -> int:
    """Direct subagent children per the index (cheap; the catalog re-checks each header)."""
    return sum(1 for e in read_children(store, session_id) if e.origin == "subagent")


def list_roots(store: Store) -> list[RootEntry]:
    """Every top-level session, oldest first (ids are time-ordered)."""
    owners = OwnerCache(store)
    roots = []
    for session_id in store.session_ids():
        try:
            header = read_header(store, session_id)
        except SubagentError:
            continue  # `store fsck` reports unreadable headers
        if header.parent_session is None:
            roots.append(RootEntry(session_id, header.label, header.created_at,
                                   session_status(store, session_id, owners), subagent_count(store, session_id)))
    return roots
