"""One session described in full: what ``subagents show`` prints.

``describe_session`` reads the header and the whole log (``inspect``), folds
it into a projection, and adds the lease, its owner's liveness, the mailbox
counts and the number of direct subagent children. Read-only: no cache is
written, no torn tail is cut, and a damaged log, lease or mailbox is
described, not raised (only a missing or unreadable header or log raises, as
``inspect`` does).
"""

from __future__ import annotations

from dataclasses import dataclass

from .catalog import ChildStatus, running_node
from .committed import CommittedEnds
from .errors import CorruptSessionError, SubagentError, UnavailableSessionError
from .lease import Lease, OwnerRecord, check_lease, owner_alive, read_owner, session_status
from .mailbox_read import pending, read_mailbox
from .outcome import OutcomeVerdict, outcome_of
from .projection import Projection
from .reader import Inspection, inspect
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
    status: ChildStatus | None  # None when the lease does not read: whether a live owner holds it is unknown
    lease: Lease | None
    owner: OwnerRecord | None
    owner_alive: bool
    mailbox: MailboxCounts
    children: int  # direct subagent children, per the index
    outcome: OutcomeVerdict  # store/outcome.py
    node: str | None = None  # where its open turn runs while a live owner holds it (``turn/start``'s ``node``)
    lease_problem: str | None = None  # why the lease slots do not read (``lease`` is then None: not "never leased")


def mailbox_counts(store: Store, session_id: str, projection: Projection, *, locked: bool = False) -> MailboxCounts:
    """Accepted messages, and how many no turn has taken yet. ``locked``: the caller holds the session lock."""
    try:
        messages = read_mailbox(store, session_id, locked=locked)
    except UnavailableSessionError as exc:  # a folder or a link in place of the mailbox
        return MailboxCounts(0, None, exc.message)
    except CorruptSessionError as exc:  # damage that is no torn tail: accepted messages may lie in it
        return MailboxCounts(None, None, exc.message)
    if not messages:
        return MailboxCounts(0, 0)  # a one-shot child's message is logged at creation, never mailed
    try:
        waiting = len(pending(store, session_id, consumed=projection.consumed, last_consumed_id=projection.last_message_id,
                              locked=locked))
    except (CorruptSessionError, UnavailableSessionError) as exc:
        return MailboxCounts(len(messages), None, exc.message)
    return MailboxCounts(len(messages), waiting)


def _lease(store: Store, session_id: str) -> tuple[Lease | None, str | None]:
    """The lease, or why it does not read: a description tells a damaged lease from none."""
    try:
        return check_lease(store, session_id), None
    except (CorruptSessionError, UnavailableSessionError) as exc:
        return None, f"{exc.code}: {exc.message}"
    except SubagentError:  # the session went away since its log was read: as if never leased
        return None, None


def describe_session(store: Store, session_id: str) -> SessionDescription:
    """Everything the store knows about one session, read without writing."""
    found = CommittedEnds(store).apply(inspect(store, session_id))
    projection = Projection(seed_length=found.header.seed_length or 0)
    projection.fold(found.events, found.offsets, found.end)
    lease, lease_problem = _lease(store, session_id)
    owner = read_owner(store, lease.owner) if lease is not None else None
    # a lease that does not read proves no holder to a writer (``read_lease``), but a description
    # must not call the session complete on it: ``ls`` shows the same child as a diagnostic row
    status = session_status(store, session_id) if lease_problem is None else None
    return SessionDescription(
        inspection=found,
        projection=projection,
        status=status,
        lease=lease,
        owner=owner,
        owner_alive=owner_alive(owner) if owner is not None else False,
        mailbox=mailbox_counts(store, session_id, projection),
        children=subagent_count(store, session_id),
        # held unless known free: a lease that does not read claims no crash
        outcome=outcome_of(projection, held=status != "complete", root=found.header.parent_session is None),
        node=running_node(projection, held=status != "complete"),
        lease_problem=lease_problem,
    )
