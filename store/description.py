"""One session described in full: what ``subagents show`` prints.

``describe_session`` reads the header and the whole log (``inspect``), folds
it into a projection, and adds the lease, its owner's liveness, the mailbox
counts and the number of direct subagent children. Read-only: no cache is
written, no torn tail is cut, and a damaged log, lease or mailbox is
described, not raised (only a missing or unreadable header or log raises, as
``inspect`` does).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .catalog import ChildStatus, running_node
from .errors import CorruptSessionError, UnavailableSessionError
from .lease import Lease, OwnerRecord, owner_alive, read_lease, read_owner, session_status
from .mailbox import pending, read_mailbox
from .outcome import OutcomeVerdict, outcome_of
from .projection import Projection
from .index import read_index
from .reader import Inspection, inspect, open_session
from .root import Store
from .roots import subagent_count

__all__ = ["MailboxCounts", "SessionDescription", "describe_session", "mailbox_counts"]


@dataclass(frozen=True)
class MailboxCounts:
    accepted: int | None  # None when the mailbox is damaged (no torn tail): how many it held is unknown
    pending: int | None  # None when log and mailbox disagree or it is damaged (then ``problem`` says how)
    problem: str | None = None


@dataclass(frozen=True)
class SessionDescription:
    inspection: Inspection  # header, valid events, log status and damage
    projection: Projection  # the fold of the valid events
    status: ChildStatus
    lease: Lease | None
    owner: OwnerRecord | None
    owner_alive: bool
    mailbox: MailboxCounts
    children: int  # direct subagent children, per the index
    outcome: OutcomeVerdict  # store/outcome.py
    node: str | None = None  # where its open turn runs while a live owner holds it (``turn/start``'s ``node``)


def mailbox_counts(store: Store, session_id: str, projection: Projection) -> MailboxCounts:
    """Accepted messages, and how many no turn has taken yet."""
    try:
        messages = read_mailbox(store, session_id)
    except UnavailableSessionError as exc:  # a folder or a link in place of the mailbox
        return MailboxCounts(0, None, exc.message)
    except CorruptSessionError as exc:  # damage that is no torn tail: accepted messages may lie in it
        return MailboxCounts(None, None, exc.message)
    if not messages:
        return MailboxCounts(0, 0)  # a one-shot child's message is logged at creation, never mailed
    try:
        waiting = len(pending(store, session_id, consumed=projection.consumed, last_consumed_id=projection.last_message_id))
    except (CorruptSessionError, UnavailableSessionError) as exc:
        return MailboxCounts(len(messages), None, exc.message)
    return MailboxCounts(len(messages), waiting)


def _lost_committed(store: Store, found: Inspection) -> bool:
    """Whether a child's log reads torn where its ``settled`` row says committed records reached further.

    Nothing appends to a settled child (its writers are fenced), so a valid prefix that ends before the
    row's ``end`` lost committed records: its last ``turn/end`` changed in place reads like a torn tail
    (FORMAT.md §3.3), and the row is what tells the two apart, as it does for a listing (§9)."""
    parent = found.header.parent_session
    if found.status != "torn" or parent is None:
        return False
    entry = next((e for e in read_index(store, parent).entries if e.id == found.header.id), None)
    if entry is None or entry.settled is None or entry.settled.end is None:
        return False
    with open_session(store, found.header.id) as file:
        return file.data_start + found.end < entry.settled.end


def describe_session(store: Store, session_id: str) -> SessionDescription:
    """Everything the store knows about one session, read without writing."""
    found = inspect(store, session_id, confirm=True)
    if _lost_committed(store, found):
        found = replace(found, status="corrupt")
    projection = Projection(seed_length=found.header.seed_length or 0)
    projection.fold(found.events, found.offsets, found.end)
    lease = read_lease(store, session_id)
    owner = read_owner(store, lease.owner) if lease is not None else None
    status = session_status(store, session_id)
    return SessionDescription(
        inspection=found,
        projection=projection,
        status=status,
        lease=lease,
        owner=owner,
        owner_alive=owner_alive(owner) if owner is not None else False,
        mailbox=mailbox_counts(store, session_id, projection),
        children=subagent_count(store, session_id),
        outcome=outcome_of(projection, held=status != "complete", root=found.header.parent_session is None),
        node=running_node(projection, held=status != "complete"),
    )
