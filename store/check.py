"""``check_store``: the store's invariants, checked from its files alone, while others write.

What a stress test asserts at its end: every log is a valid prefix (a torn
tail is a write in progress or one that never committed; corruption is a
violation), epochs never go back along a log and no two turns of one session
overlap (one writer per epoch), every accepted message is consumed at most
once and in FIFO order and none is left pending without a live or resumable
owner, the children index and the headers agree both ways, and no lease is
held by an owner that went away without dying (closed without releasing it, or
still running with a heartbeat older than its TTL). Read-only: it never takes a lock.

Other processes may be writing during the check, so every reading is ordered
to stay sound: a log before its mailbox (a consumed message is always already
in the mailbox) and before its lease (the lease epoch only grows), and each
suspected index or lease finding is read again at the end of the pass; a
discrepancy a creation still in flight explains is counted, not reported, and
so is a child its creator died before indexing, if nothing ever used it (a
creation nobody was told of, like a torn tail: ``store/acknowledgment.py``), and an entry of a session a gc
moved to ``trash/`` (a collection under way or interrupted; the next gc ends it).
Called by ``subagents.testing.check_store`` and ``subagents store check``. About 500 lines, on
purpose: the checks share one pass and its reading order, which splitting them would hide.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .acknowledgment import evidence_of_use
from .descriptor import ContinuableDescriptor
from .errors import SessionNotFoundError, SubagentError, UnavailableSessionError
from .header import SessionHeader, parent_loops
from .ids import is_valid_session_id
from .index import IndexEntry, read_children
from .roots import indexed_roots, roots_index_problem
from .mailbox_read import scan_mailbox
from .leftovers import find_leftovers
from .lease import Lease, OwnerRecord, check_lease, host_identity, owner_alive, owner_record_unreadable, process_start_time, read_lease, read_owner
from .projection import Projection
from .reader import Inspection, inspect, inspect_error_kind, read_header
from .root import Store
from .rows import row_problem

__all__ = ["ViolationKind", "Violation", "CheckCounts", "CheckReport", "check_store"]

ViolationKind = Literal[
    "log-corrupt",  # damage inside the committed region of a log
    "header-corrupt",  # a header that does not decode or breaks the header rules
    "unsupported",  # a header version or event type this build cannot read
    "unreadable",  # a session's file or mailbox the operating system refuses to read
    "epoch-regressed",  # an event written at a lower epoch than an earlier one
    "epoch-unleased",  # an event written at an epoch no lease of the session ever had
    "turn-overlap",  # a turn started while another was open: two writers in one log
    "message-duplicated",  # one accepted message consumed twice
    "message-out-of-order",  # a message consumed before one accepted earlier
    "message-unknown",  # the log consumed a message its mailbox never accepted
    "message-stranded",  # pending messages that no live owner holds and nobody can resume
    "mailbox-corrupt",  # damage in a mailbox that is no torn tail (accepted messages may lie in it)
    "index-missing",  # a header names a parent whose index lacks the child
    "parent-missing",  # a header names a parent the store no longer holds: no listing reaches it, no gc collects it
    "parent-cycle",  # a session that is its own ancestor by its headers: no listing reaches it, no gc collects it
    "index-stale",  # an index entry no header proves
    "index-row",  # a catalog row (static fields, settled state) that the child's log or lease contradicts
    "index-damaged",  # index/roots with records that do not read: listings may miss top-level sessions
    "lease-expired",  # a lease held by an owner that left without releasing it
    "owner-unreadable",  # a lease held by an owner whose record is there but does not read: it may still run
    "lease-unreadable",  # lease slots that do not decode, or a session file that cannot be read
    "trash-damaged",  # trash/ that is a link or a file: gc refuses to run (it removes what it finds there)
]

# A creation publishes its header, then appends the index entry; a rollback removes the
# header, then tombstones the entry. A discrepancy younger than this is a creation (or a
# rollback) between those two steps, unless it is still there when re-read.
IN_FLIGHT_S = 2.0


def _in_flight(now: float, created_at: float, in_flight_s: float) -> bool:
    """Whether a discrepancy of a session dated ``created_at`` may be its creation (or rollback) still
    under way: less than ``in_flight_s`` old. A date ahead of ``now`` is allowed as much (the clock
    of the host that wrote it may be ahead of this one): one further ahead is in flight on no clock,
    and would be counted so on every check until that date, instead of reported."""
    return -in_flight_s <= now - created_at < in_flight_s


@dataclass(frozen=True)
class Violation:
    """One broken invariant: the session it concerns, its kind and what shows it."""

    session_id: str
    kind: ViolationKind
    evidence: str
    seq: int | None = None  # the log record that shows it, when there is one

    def __str__(self) -> str:
        at = f" (seq {self.seq})" if self.seq is not None else ""
        return f"{self.session_id}: {self.kind}{at}: {self.evidence}"


@dataclass(frozen=True)
class CheckCounts:
    sessions: int = 0  # sessions read (a header existed when the pass listed it)
    events: int = 0  # records in the valid prefixes of their logs
    torn_tails: int = 0  # logs ending in an uncommitted write (in progress, or left by a crash)
    messages_accepted: int = 0  # mailbox records
    messages_consumed: int = 0  # of them, taken into a turn or discarded
    messages_pending: int = 0  # of them, not yet consumed
    leases_live: int = 0  # unreleased leases of live owners
    leases_dead: int = 0  # unreleased leases of owners that crashed (they read `complete`)
    in_flight: int = 0  # index discrepancies of a creation or rollback still under way
    creations_interrupted: int = 0  # headers whose creator died before indexing them, before anyone used them
    vanished: int = 0  # sessions removed between the listing and their reading
    collecting: int = 0  # index entries of sessions a gc moved to trash/ and has not forgotten yet (store/retention.py)
    set_aside: int = 0  # other programs' folders a gc found in its way and left in trash/ (``Store.set_aside``)
    interrupted_writes: int = 0  # temporary names of writes a kill interrupted; gc removes them (store/leftovers.py)


@dataclass(frozen=True)
class CheckReport:
    store: str
    checked_at: float
    counts: CheckCounts
    violations: tuple[Violation, ...] = ()

    @property
    def clean(self) -> bool:
        return not self.violations

    def of_kind(self, kind: ViolationKind) -> list[Violation]:
        return [v for v in self.violations if v.kind == kind]

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "checked_at": self.checked_at, "clean": self.clean, "counts": asdict(self.counts),
                "violations": [asdict(v) for v in self.violations]}

    def __str__(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in asdict(self.counts).items())
        head = f"store {self.store}: {'clean' if self.clean else f'{len(self.violations)} violation(s)'} ({counts})"
        return "\n".join([head, *(f"  {v}" for v in self.violations)])


@dataclass
class _Pass:
    """The mutable state of one check: tallies, findings, and what to read again at the end."""

    store: Store
    now: float
    host: str
    counts: dict[str, int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    headers: dict[str, SessionHeader] = field(default_factory=dict)
    owners: dict[str, OwnerRecord | None] = field(default_factory=dict)
    suspect_leases: list[str] = field(default_factory=list)

    def add(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def flag(self, session_id: str, kind: ViolationKind, evidence: str, seq: int | None = None) -> None:
        self.violations.append(Violation(session_id, kind, evidence, seq))

    def owner(self, owner_id: str) -> OwnerRecord | None:
        if owner_id not in self.owners:
            self.owners[owner_id] = read_owner(self.store, owner_id)
        return self.owners[owner_id]


def check_store(store: Store | str | os.PathLike[str], *, in_flight_s: float = IN_FLIGHT_S) -> CheckReport:
    """Check every invariant of the store at ``store``; never raises for what it finds in it.

    ``in_flight_s``: an index discrepancy of a session created (or indexed) less
    than this long ago, or dated at most this far ahead, is a creation still
    under way, counted in ``in_flight``.
    """
    handle = store if isinstance(store, Store) else Store(store, create=False)
    state = _Pass(handle, time.time(), host_identity())
    for session_id in _listed(handle):
        _check_session(state, session_id)
    _check_index(state, in_flight_s)
    _recheck_leases(state)
    state.add("set_aside", len(handle.set_aside()))
    if (problem := handle.trash_problem()) is not None:
        state.flag("trash", "trash-damaged", f"{problem}: gc refuses to run until it is moved away (gc makes a new one)")
    state.add("interrupted_writes", len(find_leftovers(handle)))
    return CheckReport(handle.root, state.now, CheckCounts(**state.counts), tuple(state.violations))


def _listed(store: Store) -> list[str]:
    """Every session id in ``sessions/``, whatever its file type: a folder, a link or a FIFO in a
    session's place is damage that ``inspect`` reports (listings show it as a diagnostic)."""
    try:
        return store.session_ids(any_type=True)
    except FileNotFoundError:
        return []


# -- one session ------------------------------------------------------------------------


def _check_session(state: _Pass, session_id: str) -> None:
    try:
        found = inspect(state.store, session_id)  # the log first: see the module docstring
    except SessionNotFoundError:
        state.add("vanished")
        return
    except SubagentError as exc:
        kind: ViolationKind = inspect_error_kind(exc.code)
        state.add("sessions")
        state.flag(session_id, kind, f"{exc.code}: {exc.message}")
        return
    except OSError as exc:
        state.add("sessions")
        state.flag(session_id, "unreadable", f"{type(exc).__name__}: {exc}")
        return
    state.add("sessions")
    state.headers[session_id] = found.header
    state.add("events", len(found.events))
    if found.status == "torn":
        state.add("torn_tails")
    elif found.status == "corrupt":
        assert found.damage is not None
        state.flag(session_id, "log-corrupt", f"{found.damage.reason} at byte {found.damage.offset}, and a committed "
                   f"record follows it ({found.damage.dropped} bytes after the valid prefix)")
    own = found.events[found.header.seed_length or 0 :]
    _check_epochs_and_turns(state, session_id, own)
    lease = _read_lease(state, session_id)
    if isinstance(lease, _Unread):
        return
    _check_lease_covers_log(state, session_id, own, lease)
    pending = _check_messages(state, found, own)
    held = _check_lease(state, session_id, lease)
    if pending and not held and not _resumable(found):
        state.flag(session_id, "message-stranded", f"{pending} accepted message(s) pending, no live owner holds the "
                   "session and it cannot be resumed" + (" (its log is corrupt)" if found.status == "corrupt" else
                                                         " (no continuable descriptor of its own)"))


class _Unread:
    """No lease to check: the session went, or its lease does not read (flagged)."""


_UNREAD = _Unread()


def _read_lease(state: _Pass, session_id: str) -> Lease | None | _Unread:
    """The session's lease (``None``: never leased); ``_UNREAD`` when its slots do not read (flagged
    ``lease-unreadable``) or it was collected since its log was read (a gc beside the check: ``vanished``)."""
    try:
        return check_lease(state.store, session_id)
    except SessionNotFoundError:
        state.add("vanished")
    except SubagentError as exc:
        state.flag(session_id, "lease-unreadable", f"{exc.code}: {exc.message}")
    return _UNREAD


# what a resume appends to close a turn a crash left open, at the new writer's epoch (store/events.py)
_CLOSERS = frozenset({"tool/result", "step/end", "turn/end"})


def _check_epochs_and_turns(state: _Pass, session_id: str, own: list[dict[str, Any]]) -> None:
    """Epochs never go back; a turn is written at one epoch (but for crash closers) and never overlaps another."""
    highest, open_turn = 0, None
    for event in own:
        epoch = event.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            epoch = 0
        seq, kind = event["seq"], event.get("type")
        if epoch < highest:
            state.flag(session_id, "epoch-regressed", f"epoch {epoch} after epoch {highest}", seq)
        highest = max(highest, epoch)
        if open_turn is None:
            open_turn = event if kind == "turn/start" else None
            continue
        if kind == "turn/start":
            state.flag(session_id, "turn-overlap", f"turn/start at epoch {epoch} while the turn started at seq "
                       f"{open_turn['seq']} (epoch {open_turn.get('epoch')}) is open", seq)
            open_turn = event
        elif epoch > open_turn.get("epoch", 0) and kind not in _CLOSERS:
            state.flag(session_id, "turn-overlap", f"{kind} at epoch {epoch} inside the turn of epoch "
                       f"{open_turn.get('epoch')} started at seq {open_turn['seq']}, which no repair closed", seq)
            open_turn = None
        elif kind == "turn/end":
            open_turn = None


def _check_lease_covers_log(state: _Pass, session_id: str, own: list[dict[str, Any]], lease: Lease | None) -> None:
    """Every epoch in the log was granted: the lease, read after the log, is at least as high."""
    granted = 0 if lease is None else lease.epoch
    for event in own:
        epoch = event.get("epoch")
        if isinstance(epoch, int) and epoch > granted:
            state.flag(session_id, "epoch-unleased", f"written at epoch {epoch}, but the lease " +
                       ("does not exist" if lease is None else f"is at epoch {granted}"), event["seq"])
            return


def _consumed_id(event: dict[str, Any]) -> str | None:
    if event.get("type") not in ("message/accepted", "message/discarded"):
        return None
    data = event.get("data")
    return str(data.get("message_id")) if isinstance(data, dict) else None


def _check_messages(state: _Pass, found: Inspection, own: list[dict[str, Any]]) -> int:
    """FIFO, at-most-once consumption against the mailbox; returns the number pending."""
    session_id = found.header.id
    mailbox = _read_mailbox(state, session_id)
    if mailbox is None:
        return 0  # the session went while its mailbox was read: nothing of it is left to compare
    ids = [m.get("id") for m in mailbox]
    position = {message_id: i for i, message_id in enumerate(ids)}
    state.add("messages_accepted", len(ids))
    head, seen, taken, turns_started = 0, set(), set(), False
    for event in own:
        turns_started = turns_started or event.get("type") == "turn/start"
        message_id = _consumed_id(event)
        if message_id is None:
            continue
        seq = event["seq"]
        if message_id in seen:
            state.flag(session_id, "message-duplicated", f"message {message_id} consumed again", seq)
            continue
        seen.add(message_id)
        if message_id not in position:
            # a one-shot child's prompt is written into the log at creation (epoch 0, before
            # any turn), without a mailbox record: consumed inline, not from the mailbox
            if turns_started or event.get("epoch") != 0:
                state.flag(session_id, "message-unknown", f"message {message_id} consumed, never accepted in the mailbox", seq)
            continue
        at = position[message_id]
        if at != head:
            state.flag(session_id, "message-out-of-order", f"message {message_id} (mailbox record {at}) consumed while "
                       f"{ids[head]} (record {head}) was next", seq)
        taken.add(at)
        while head in taken:
            head += 1
    state.add("messages_consumed", len(taken))
    state.add("messages_pending", len(ids) - len(taken))
    return len(ids) - len(taken)


def _read_mailbox(state: _Pass, session_id: str) -> list[dict[str, Any]] | None:
    """The mailbox's records (``[]``: none); ``None`` when the session went meanwhile, or its mailbox does not read."""
    try:
        found = scan_mailbox(state.store, session_id)  # what the mailbox's readers and writers read, by their rule
    except SessionNotFoundError:
        state.add("vanished")
        return None
    except UnavailableSessionError as exc:
        state.flag(session_id, "unreadable", f"{exc.code}: {exc.message}")
        return None
    if found is None:
        if not state.store.exists(session_id):  # gc moves a session's file before its mailbox: collected meanwhile
            state.add("vanished")
            return None
        return []
    damage = found.result.damage
    if found.corrupt and damage is not None:
        # anything but the cut-short last frame of an acceptance that never returned may hold accepted messages
        state.flag(session_id, "mailbox-corrupt", f"{damage.reason} at byte {damage.offset} is no torn tail: "
                   "accepted messages may lie in it or after it")
    return found.result.records


def _resumable(found: Inspection) -> bool:
    """A top-level session (``open_root(id=...)``) or a continuable child with a sound log."""
    if found.header.parent_session is None:
        return True
    if found.status == "corrupt":
        return False
    projection = Projection(seed_length=found.header.seed_length or 0)
    projection.fold(found.events, found.offsets, found.end)
    return isinstance(projection.resume, ContinuableDescriptor) and projection.resume_error is None


def _check_lease(state: _Pass, session_id: str, lease: Lease | None) -> bool:
    """Whether a live owner holds the session; a lease an owner abandoned alive is re-read at the end."""
    if lease is None or lease.state == "released":
        return False
    record = state.owner(lease.owner)
    if owner_alive(record, now=state.now, host=state.host):
        state.add("leases_live")
        return True
    if _abandoned(state.store, lease.owner, record, now=state.now, host=state.host) is None:
        state.add("leases_dead")
    else:
        state.suspect_leases.append(session_id)
    return False


def _abandoned(store: Store, owner_id: str, record: OwnerRecord | None, *, now: float, host: str) -> tuple[ViolationKind, str] | None:
    """Why a lease no live owner proves is a violation, or ``None`` when the owner crashed (the lease is
    then harmless). An owner file that is there but does not read proves neither: it is named as such."""
    if record is None:
        if owner_record_unreadable(store, owner_id):
            return "owner-unreadable", f"its owner's record owners/{owner_id} does not read: the owner may still run"
        return "lease-expired", "its owner's record is gone: the owner closed without releasing it"
    if record.host == host and record.pid_start is not None and process_start_time(record.pid) == record.pid_start:
        age = now - record.heartbeat_at
        return "lease-expired", f"its owner (pid {record.pid}) still runs, but its heartbeat is {age:.1f}s old (TTL {record.ttl:g}s)"
    return None


def _recheck_leases(state: _Pass) -> None:
    """Read suspect leases and owners again: a closing owner releases its leases before it removes its record."""
    now = time.time()
    for session_id in state.suspect_leases:
        lease = read_lease(state.store, session_id)
        if lease is None or lease.state == "released":
            continue
        record = read_owner(state.store, lease.owner)
        if owner_alive(record, now=now, host=state.host):
            state.add("leases_live")
            continue
        why = _abandoned(state.store, lease.owner, record, now=now, host=state.host)
        if why is None:
            state.add("leases_dead")
        else:
            state.flag(session_id, why[0], f"lease epoch {lease.epoch} ({lease.state}) held by {lease.owner}: {why[1]}")


# -- the children index ---------------------------------------------------------------


def _check_index(state: _Pass, in_flight_s: float) -> None:
    """Headers → index and index → headers; a discrepancy is read again before it is reported."""
    proven: dict[str, set[str]] = {}
    for session_id, header in state.headers.items():
        if header.parent_session is not None:
            proven.setdefault(header.parent_session, set()).add(session_id)
            if header.parent_session not in state.headers:
                _confirm_orphan(state, session_id, header.parent_session)
    for session_id, loop in parent_loops({sid: h.parent_session for sid, h in state.headers.items()}).items():
        state.flag(session_id, "parent-cycle", f"its header's parents loop ({' → '.join(loop)}): no listing reaches it and no gc collects it")
    try:
        names = os.listdir(state.store.children_index_dir)
    except FileNotFoundError:
        names = []
    _check_roots(state, in_flight_s)
    parents = {n for n in names if is_valid_session_id(n)} | set(proven)
    for parent in sorted(parents):
        indexed = {e.id: e for e in read_children(state.store, parent)}
        for child in sorted(proven.get(parent, set()) - set(indexed)):
            _confirm_missing(state, parent, child, in_flight_s)
        for child in sorted(set(indexed) - proven.get(parent, set())):
            _confirm_stale(state, parent, child, indexed[child].created_at, in_flight_s)
        for child in sorted(set(indexed) & proven.get(parent, set())):
            _confirm_row(state, parent, indexed[child])


def _check_roots(state: _Pass, in_flight_s: float) -> None:
    """``index/roots`` reads whole and lists every top-level header (when it reads: without a
    readable index, listings read the headers). A root younger than ``in_flight_s`` may be between its header and
    its entry; the index is read again before a missing root is reported. An index that lists no root at all
    (emptied, or tombstones alone) misses every top-level header older than that: listings read around it with a
    warning, but it is the index they read, and only ``reindex`` makes it whole again."""
    store = state.store
    problem = roots_index_problem(store)
    if problem is not None:
        state.flag("roots", "index-damaged", f"{problem}; run `subagents store reindex`")
    listed = indexed_roots(store)
    if listed is None:  # no readable index: listings read every header, none is missed
        return
    tops = {sid for sid, header in state.headers.items() if header.parent_session is None}
    missing = tops - listed
    if missing:
        missing -= indexed_roots(store) or set()  # read again: a creation may have appended meanwhile
    for root in sorted(missing):
        if _in_flight(state.now, state.headers[root].created_at, in_flight_s):
            state.add("in_flight")
            continue
        if not store.exists(root):  # gc drops a root's entry once its file is moved away: collected meanwhile
            state.add("vanished")
            continue
        state.flag(root, "index-missing", "a top-level session absent from index/roots: listings that read the index miss it"
                   if listed else "a top-level session absent from index/roots, which lists no root: listings read every "
                   "header around it, with a warning, until `subagents store reindex`")


def _confirm_row(state: _Pass, parent: str, entry: IndexEntry) -> None:
    """A row the child's files contradict, read again (index, then files) before it is reported:
    a lease change writes the row and the lease under one lock, and this check takes none."""
    problem = _row_problem(state, entry)
    if problem is None:
        return
    again = next((e for e in read_children(state.store, parent) if e.id == entry.id), None)
    if again != entry:
        state.add("in_flight")  # the row moved on (a release, a re-activation) while it was read
        return
    problem = _row_problem(state, entry)
    if problem is not None:
        state.flag(entry.id, "index-row", f"in the children index of {parent}: {problem}")


def _row_problem(state: _Pass, entry: IndexEntry) -> str | None:
    try:
        header = read_header(state.store, entry.id)
        lease = read_lease(state.store, entry.id)
        live = lease is not None and owner_alive(state.owner(lease.owner), now=time.time(), host=state.host)
        return row_problem(state.store, entry, header, lease, live)
    except SubagentError:
        return None  # damage of the child's own files is reported with its session
    except OSError:
        return None


def _confirm_orphan(state: _Pass, child: str, parent: str) -> None:
    """A child whose parent's header was not among those read: a parent whose file does not read is
    reported with its own session; any other is gone from under the child. (A gc moves a subtree's
    children before their parent, so even a parent in ``trash/`` left this child behind.)"""
    if state.store.exists(parent) or not state.store.exists(child):
        return
    state.flag(child, "parent-missing", f"its header names parent {parent}, which the store does not hold: "
                                        "no listing reaches it and no gc collects it")


def _confirm_missing(state: _Pass, parent: str, child: str, in_flight_s: float) -> None:
    if any(e.id == child for e in read_children(state.store, parent)):
        return  # the creation appended its entry since the first reading
    header = state.headers[child]
    if not state.store.exists(child):
        state.add("in_flight")  # rolled back since: its header is gone
        return
    lease = read_lease(state.store, child)
    creator_alive = lease is not None and lease.epoch == 1 and owner_alive(read_owner(state.store, lease.owner))
    if _in_flight(time.time(), header.created_at, in_flight_s) or creator_alive:
        state.add("in_flight")
        return
    if evidence_of_use(state.store, child, has_children=any(h.parent_session == child for h in state.headers.values())) is None:
        # its creator died between publishing the header and indexing it: like a torn tail, a
        # creation nobody was told of (start returns after the index entry) and nothing used
        state.add("creations_interrupted")
        return
    state.flag(child, "index-missing", f"its header names parent {parent}, whose children index does not list it")


def _confirm_stale(state: _Pass, parent: str, child: str, indexed_at: float, in_flight_s: float) -> None:
    try:
        header = read_header(state.store, child)
    except SessionNotFoundError:
        header = None
    except SubagentError:
        return  # an unreadable header is reported with its session
    if header is not None and header.parent_session == parent:
        return  # created after the listing of sessions: its header proves the entry
    if header is None and state.store.in_trash(child):
        state.add("collecting")  # a gc under way, or interrupted: the next gc drops the entry
        return
    if header is None and _in_flight(time.time(), indexed_at, in_flight_s):
        state.add("in_flight")  # a creation rolling back: its file removed, tombstone not yet appended
        return
    names = "no header" if header is None else f"a header naming parent {header.parent_session}"
    state.flag(child, "index-stale", f"listed in the children index of {parent}, but has {names}")
