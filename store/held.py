"""Sessions a live owner holds right now: what ``subagents top`` shows.

A session is held while its lease is ``running`` or ``idle`` and its owner's
heartbeat is fresh (``OwnerCache``). Finding them costs one lease read per
session in the store, and a projection read (cached checkpoint plus the log
after it) per held session, so the timing is exact mid-turn. Never writes a
byte; a session that stops reading in between is skipped (``store fsck``
reports it). What is *not* guaranteed: the snapshot is not atomic across
sessions; a lease may be released between two reads (then the row is left out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .descriptor import ContinuableDescriptor, OneShotDescriptor
from .errors import SubagentError
from .lease import OwnerCache, read_lease, read_owner, session_status
from .log import read_projection
from .outcome import Outcome, outcome_of
from .reader import read_header
from .root import Store

__all__ = ["HeldSession", "held_sessions"]


@dataclass(frozen=True)
class HeldSession:
    id: str
    label: str | None
    mode: str  # the descriptor's mode; "root" for a top-level session, "-" for a plain fork
    parent: str | None
    status: Literal["running", "idle"]
    epoch: int
    owner: str
    owner_pid: int | None
    owner_host: str | None
    settled_ms: float  # time spent in settled turns
    active_since: float | None  # when the open turn started, if one is open
    outcome: Outcome | None = None  # its last finished turn's (store/outcome.py); None: none finished yet
    error_code: str | None = None
    error: str | None = None
    node: str | None = None  # where its open turn runs (``host:pid``; on Ray ``ip/node:pid``), if one is open


def held_sessions(store: Store) -> list[HeldSession]:
    """Every session a live owner holds, in id order."""
    owners = OwnerCache(store)
    rows = []
    for session_id in store.session_ids():
        lease = read_lease(store, session_id)
        if lease is None or not owners.holds(lease):
            continue
        status = session_status(store, session_id, owners)
        if status == "complete":
            continue  # released between the two reads
        try:
            header = read_header(store, session_id)
            # the cached checkpoint plus the log after it: exact mid-turn (an open turn's start is
            # after the last commit point, where the catalog's identity cache stops)
            projection = read_projection(store, session_id)
        except (SubagentError, OSError):
            continue  # `store fsck` reports what does not read
        ident = projection.identity
        descriptor = ident if isinstance(ident, (OneShotDescriptor, ContinuableDescriptor)) else None
        owner = read_owner(store, lease.owner)
        verdict = outcome_of(projection, held=True, root=header.parent_session is None)
        rows.append(HeldSession(
            id=session_id,
            # a child's label is in its descriptor, a root's in its header (``open_root(label=...)``): `ls` shows both
            label=descriptor.label if descriptor is not None else header.label,
            mode=descriptor.mode if descriptor is not None else ("root" if header.parent_session is None else "-"),
            parent=header.parent_session,
            status=status,
            epoch=lease.epoch,
            owner=lease.owner,
            owner_pid=owner.pid if owner is not None else None,
            owner_host=owner.host if owner is not None else None,
            settled_ms=projection.timing.settled_ms,
            active_since=projection.timing.active_since,
            outcome=verdict.outcome,
            error_code=verdict.error_code,
            error=verdict.error,
            node=projection.open_node if projection.open_turn is not None else None,
        ))
    return rows
