"""``fsck``: check every session of a store, and repair torn tails on request.

One finding per problem, never a crash: a corrupt or unreadable session is
reported and left alone; torn tails are repaired only with ``repair=True``,
through the resume path (``LogWriter.open``) under a lease the check takes
for the moment (a session whose lease a live owner holds is skipped: that
owner repairs on its own resume). Also reports index entries no header
backs and headers the index misses (``reindex`` fixes both) — but a header
the index misses whose session was never used is ``unacknowledged``: a
creation interrupted before its entry, whose id nobody was given
(``store/acknowledgment.py``; ``reindex`` leaves it out) — index files
with damaged records or that cannot be read (``reindex`` rewrites them),
unreadable or undecodable leases and control files, leases an owner that
closed left held (``lease-abandoned``: released on repair), mailboxes that no
longer hold the messages their log consumed or that hold damage that is no torn
tail, among the consumed messages too (``mailbox-damaged``: FORMAT.md §3.3; never
repaired), session files that
are symbolic links (never followed), names in ``sessions/`` that are no
session (a creation's leftover temporary file, a folder, an orphaned
companion: ``no-header`` / ``stray``), index entries of sessions whose
header does not read (``index-unproven``: kept, the only record of where the
damaged session belongs), and index entries of sessions an
interrupted ``gc`` left in ``trash/`` (``collecting``: harmless, the next gc ends it), and folders
a gc moved aside in ``trash/`` rather than delete (``set-aside``: another program's), and the
temporary files of rewrites a kill interrupted (``interrupted-write``: ``store/leftovers.py``), and sessions whose
header names a parent the store no longer holds (``parent-missing``: no listing reaches them), and sessions
that are their own ancestors by headers edited by hand (``parent-cycle``: the same), and ``settled`` rows that say a
child has no children while its index lists one (``row-stale``: an earlier version's creation under a settled child;
written again on repair). Every read goes through the store's
defensive readers, so a damaged file is a finding about its own session.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from typing import Any

from .acknowledgment import evidence_of_use
from .control import INVALID, read_controls
from .committed import CommittedEnds
from .errors import LeaseHeldError, SubagentError, UnreadableStoreError
from .header import parent_loops
from .ids import is_valid_session_id
from .index import IndexEntry, read_index
from .leftovers import find_leftovers
from .lease import acquire_lease, check_lease, maintenance_owner, owner_alive, owner_record_unreadable, read_lease, read_owner, release_lease
from .log import LogWriter, read_projection
from .mailbox import require_consumed_prefix
from .mailbox_read import read_mailbox
from .reader import Inspection, inspect, inspect_error_kind, read_header
from .root import COMPANIONS, Store
from .roots import indexed_roots, roots_index_problem
from .rows import has_subagent_children, repair_has_children

__all__ = ["fsck"]


def fsck(store: Store, *, repair: bool, lease_ttl_s: float) -> dict[str, Any]:
    """Inspect every session file; one finding per problem, never a crash.

    With ``repair``, a torn tail is truncated (and an open turn closed) by
    opening a ``LogWriter``, the resume path, under a lease this check takes
    for the moment of the repair: at epoch 0 when the session never had a
    lease, else by acquiring it (epoch + 1), which fences any writer that
    still believes it owns the session. A lease held by a live owner is left
    alone (that owner repairs on its own resume). Corrupt logs are never touched.
    """
    # ``unreadable``: files this process cannot read now (another user's, a link in a session's place, a lock a
    # stuck holder keeps), which say nothing of damage
    counts = {"clean": 0, "torn": 0, "corrupt": 0, "unsupported": 0, "unreadable": 0}
    findings: list[dict[str, Any]] = []
    try:
        names = sorted(os.listdir(store.sessions_dir))
    except PermissionError as exc:  # nothing of the store can be checked: not "0 sessions, every index entry stale"
        raise UnreadableStoreError.of(store.root, exc) from None
    except OSError as exc:
        names = []
        findings.append({"id": "sessions", "kind": "unreadable", "detail": f"the sessions folder cannot be listed: {exc}"})
    checked = 0
    present = set(names)
    committed = CommittedEnds(store)  # a settled child's row proves where its records end: damage before it is no torn tail
    for name in names:
        path = os.path.join(store.sessions_dir, name)
        finding_of_name = _name_finding(name, path, present)
        if finding_of_name is not None:
            kind, detail = finding_of_name
            counts["unreadable"] += kind == "unreadable"
            checked += kind == "unreadable"  # a link in a session's place: a session, counted as it is reported
            findings.append({"id": name, "kind": kind, "detail": detail})
            continue
        if "." in name:
            continue  # a companion of a session that is here: read with its session
        checked += 1
        try:
            found = committed.apply(inspect(store, name))
        except SubagentError as exc:
            kind = inspect_error_kind(exc.code)
            counts["corrupt" if kind == "header-corrupt" else kind] += 1
            findings.append({"id": name, "kind": kind, "detail": f"{exc.code}: {exc.message}"})
            continue
        findings.extend(_side_files(store, name))
        counts[found.status] += 1
        if found.status != "clean":
            findings.extend(_damage_finding(store, name, found, repair=repair, lease_ttl_s=lease_ttl_s))
        # after a torn tail's repair, which took the lease and released it (then nothing is left to release)
        abandoned = _abandoned_lease(store, name, repair=repair, lease_ttl_s=lease_ttl_s)
        if abandoned is not None:
            findings.append(abandoned)
    findings.extend(_index_findings(store, [name for name in names if is_valid_session_id(name)], repair=repair))
    findings.extend({"id": one.name, "kind": "interrupted-write", "detail": f"the temporary file of a rewrite whose "
                     f"process (pid {one.pid}) was killed before renaming it: harmless, never read; the next "
                     f"`subagents gc` removes it" + ("" if one.removable else " once it is a minute old and its process gone")}
                    for one in find_leftovers(store, sessions=False))  # those in sessions/: ``no-header`` above
    findings.extend({"id": name, "kind": "set-aside", "detail": "a folder gc found where it was about to delete (another "
                     "program's: a name a power loss and `e2fsck -y` left after an interrupted gc) and moved to trash/ "
                     "instead; no gc touches it: look inside and remove it by hand"} for name in store.set_aside())
    if (problem := store.trash_problem()) is not None:
        findings.append({"id": "trash", "kind": "trash-damaged",
                         "detail": f"{problem}: gc refuses to run until it is moved away (gc makes a new one)"})
    return {
        "store": store.root,
        "sessions": checked,
        "counts": counts,
        "torn": [f["id"] for f in findings if f["kind"] == "torn"],
        "corrupt": [f["id"] for f in findings if f["kind"] in ("corrupt", "header-corrupt", "unreadable")],
        # a sound log whose mailbox no longer lines up with it: every message sent to it is refused
        "damaged_mailboxes": [f["id"] for f in findings if f["kind"] == "mailbox-damaged"],
        "repaired": [f["id"] for f in findings if f.get("repaired")],
        "findings": findings,
    }


def _name_finding(name: str, path: str, present: set[str]) -> tuple[str, str] | None:
    """The finding (kind, detail) a name in ``sessions/`` is, or ``None``: a session file to
    check, or a companion beside a session that is here."""
    stem, dot, suffix = name.partition(".")
    if not dot:
        if not is_valid_session_id(name):
            return "stray", "not a session file"
        if os.path.islink(path):
            return "unreadable", "the session file is a symbolic link (never followed)"
        if os.path.isdir(path):
            return "stray", "a folder, not a session file (a store of format 1 is converted by `subagents store migrate`)"
        return None
    if not stem and ".new." in name:
        return "no-header", "a creation that never published its file (nothing lists or resumes it; the next `subagents gc` removes it)"
    if is_valid_session_id(stem) and suffix in COMPANIONS:
        if stem in present:
            return None
        return "stray", f"the {suffix} of a session that no longer exists (an interrupted gc; the next `subagents gc` removes it)"
    return "stray", "not a session file"


def _side_files(store: Store, session_id: str) -> list[dict[str, Any]]:
    """Findings about a readable session's lease, mailbox and control file."""
    out: list[dict[str, Any]] = []
    try:
        check_lease(store, session_id)
    except SubagentError as exc:
        out.append({"id": session_id, "kind": "lease-unreadable", "detail": f"{exc.code}: {exc.message}"})
    try:
        mode: int | None = os.lstat(store.path(session_id, "control")).st_mode
    except FileNotFoundError:
        mode = None
    if os.path.lexists(store.path(session_id, "mailbox")):
        damaged = _mailbox_damage(store, session_id)
        if damaged is not None:
            out.append({"id": session_id, "kind": "mailbox-damaged", "detail": damaged})
    if mode is not None and not stat.S_ISREG(mode):
        out.append({"id": session_id, "kind": "control-unreadable", "detail": "the control file is not a regular file"})
    else:
        bad = [r for r in read_controls(store, session_id) if r.kind == INVALID]
        if bad:
            out.append({"id": session_id, "kind": "control-damaged",
                        "detail": f"{len(bad)} control record(s) skipped, first: {bad[0].problem}"})
    return out


def _mailbox_damage(store: Store, session_id: str) -> str | None:
    """What is wrong with a session's mailbox, or ``None``: it holds the messages its log consumed, and
    no part of it holds damage that is no torn tail (FORMAT.md §3.3).

    Two readings. The acceptance's own check (``require_consumed_prefix``: the log agrees with the
    mailbox, and what follows the consumed messages reads) reads from where the consumed messages
    end, O(pending); alone it let damage before that end pass, which ``store check`` reports
    (``mailbox-corrupt``) and ``show`` and a send from a new process run into (an append with no
    checkpoint reads the mailbox from its start, and refuses). So the whole mailbox is read too.
    Either way the mailbox is left as it is, ``--repair`` or not: only a torn tail may be cut,
    by the next acceptance, and every other byte may be an accepted message.

    The first reading needs the log's projection: a log that does not read is the log's own
    finding (``corrupt``), and was reported a second time as this mailbox's, which was intact;
    the mailbox is then read whole, alone."""
    consumed_end = 0
    try:
        projection = read_projection(store, session_id)
    except (SubagentError, OSError):
        projection = None
    if projection is not None:
        try:
            consumed_end = require_consumed_prefix(store, session_id, projection)
        except (SubagentError, OSError) as exc:
            # an acceptance is refused until the mailbox is restored: it would never be delivered
            return f"{_said(exc)} (messages sent to it are refused)"
    try:
        read_mailbox(store, session_id)
    except (SubagentError, OSError) as exc:
        offset = exc.fields.get("offset") if isinstance(exc, SubagentError) else None
        where = (f"; the damage lies in the messages its log already consumed (before byte {consumed_end}), no pending "
                 "message in it" if isinstance(offset, int) and offset < consumed_end else "")
        return f"{_said(exc)}{where} (messages sent to it are refused)"
    return None


def _said(exc: SubagentError | OSError) -> str:
    """An error as a finding's detail: its code (an ``OSError``: its type) and message."""
    if isinstance(exc, SubagentError):
        return f"{exc.code}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


def _damage_finding(store: Store, session_id: str, found: Inspection, *, repair: bool, lease_ttl_s: float) -> list[dict[str, Any]]:
    """The finding of a torn or corrupt log (a torn one repaired on ``repair``); none without its damage."""
    damage = found.damage
    if damage is None:  # a status other than clean always carries its damage
        return []
    detail = f"{damage.reason} at byte {damage.offset}" + (f" ({damage.detail})" if damage.detail else "") + f", {damage.dropped} bytes after the valid prefix"
    finding: dict[str, Any] = {"id": session_id, "kind": found.status, "detail": detail, "damage": dataclasses.asdict(damage),
                               "valid_events": len(found.events)}
    if found.status == "corrupt":
        finding["detail"] += "; committed work follows the damage"
    elif repair:
        try:
            finding["repair"] = _repair_torn(store, session_id, lease_ttl_s)
        except SubagentError as exc:  # a damaged lease or lock: reported, the session left as it is
            finding["repair"] = f"not repaired: {exc.code}: {exc.message}"
        finding["repaired"] = finding["repair"].startswith("repaired")
    return [finding]


def _abandoned_lease(store: Store, session_id: str, *, repair: bool, lease_ttl_s: float) -> dict[str, Any] | None:
    """A lease held by an owner whose record is gone (``lease-abandoned``), released on ``repair``.

    A closing owner releases its leases before it removes its record, so no owner will ever release
    this one; ``store check`` counts it a violation (``lease-expired``). It is harmless to a host
    (the next acquisition takes it over) but stays a violation until then, and a one-shot child is
    never acquired again: the repair takes the lease (a new epoch, which fences whoever still
    believes it holds it) and releases it. A lease whose owner crashed (its record is left) is no
    finding: nothing went wrong there that a host does not handle.
    """
    try:
        lease = read_lease(store, session_id)
    except SubagentError:
        return None  # ``lease-unreadable``, from ``_side_files``
    if lease is None or lease.state == "released" or read_owner(store, lease.owner) is not None:
        return None
    if owner_record_unreadable(store, lease.owner):
        # there, but it does not read: its supervisor may still run, and a release would fence it
        unread: dict[str, Any] = {
            "id": session_id, "kind": "owner-unreadable",
            "detail": f"lease epoch {lease.epoch} ({lease.state}) held by {lease.owner}, whose record owners/{lease.owner} does "
                      "not read: the owner may still run (once that supervisor is known to be gone, remove the file and run "
                      "fsck --repair again)"}
        if repair:
            unread.update(repair="not released: its owner may still run", repaired=False)
        return unread
    finding: dict[str, Any] = {"id": session_id, "kind": "lease-abandoned", "detail": f"lease epoch {lease.epoch} "
                               f"({lease.state}) held by {lease.owner}: its owner's record is gone: the owner closed without releasing it"}
    if repair:
        with maintenance_owner(store, ttl=lease_ttl_s) as owner_id:
            try:
                taken = acquire_lease(store, session_id, owner_id)
                release_lease(store, session_id, owner_id, taken.epoch)
                finding["repair"] = f"released at epoch {taken.epoch}"
            except SubagentError as exc:  # taken meanwhile by a live owner, or damaged: left as it is
                finding["repair"] = f"not released: {exc.code}: {exc.message}"
        finding["repaired"] = finding["repair"].startswith("released")
    return finding


def _repair_torn(store: Store, session_id: str, lease_ttl_s: float) -> str:
    lease = read_lease(store, session_id)
    if lease is not None and lease.state != "released" and owner_alive(read_owner(store, lease.owner)):
        return f"not repaired: owner {lease.owner} is alive and holds the lease (epoch {lease.epoch})"
    try:
        never_leased = check_lease(store, session_id) is None
    except SubagentError:
        never_leased = False  # damaged: the acquisition below refuses it
    if never_leased:
        with LogWriter.open(store, session_id, epoch=0) as writer:
            closed = len(writer.repaired)
        return "repaired at epoch 0" + (f", {closed} closing events appended" if closed else "")
    with maintenance_owner(store, ttl=lease_ttl_s) as owner_id:
        try:
            taken = acquire_lease(store, session_id, owner_id)
        except LeaseHeldError as exc:
            return f"not repaired: {exc.message}"
        try:
            with LogWriter.open(store, session_id, epoch=taken.epoch) as writer:
                closed = len(writer.repaired)
        finally:
            release_lease(store, session_id, owner_id, taken.epoch)
    return f"repaired under lease epoch {taken.epoch}" + (f", {closed} closing events appended" if closed else "")


def _index_findings(store: Store, session_ids: list[str], *, repair: bool = False) -> list[dict[str, Any]]:
    """Index entries the headers do not back, headers the index misses (roots too), and damaged index
    files, ``index/roots`` included (``store reindex`` fixes all three); and ``settled`` rows that say a
    child has no children while its index lists one (``row-stale``, written again on ``repair``). ``session_ids``: every id in
    ``sessions/`` whatever its file type: a folder, a link or a FIFO in a session's place has a header
    that does not read, and ``reindex`` keeps its entry as it keeps a damaged file's."""
    proven: dict[str, set[str]] = {}
    parent_of: dict[str, str] = {}
    tops: set[str] = set()
    unreadable: set[str] = set()
    for session_id in session_ids:
        try:
            header = read_header(store, session_id)
        except SubagentError:
            unreadable.add(session_id)
            continue
        if header.parent_session is not None:
            proven.setdefault(header.parent_session, set()).add(session_id)
            parent_of[session_id] = header.parent_session
        else:
            tops.add(session_id)
    findings: list[dict[str, Any]] = []
    try:
        names = os.listdir(store.children_index_dir)
    except OSError as exc:
        names = []
        findings.append({"id": "index", "kind": "index-damaged", "detail": f"the index folder cannot be listed: {exc} (run `subagents store reindex`)"})
    problem = roots_index_problem(store)
    if problem is not None:
        findings.append({"id": "roots", "kind": "index-damaged", "detail": f"{problem}: listings may miss top-level "
                         "sessions (run `subagents store reindex`)"})
    listed = indexed_roots(store)
    if listed is not None:  # without a readable index, listings read every header: none is missed
        # an index with records stepped over is read beside the headers (store/roots.py): a root its damage
        # lost is still listed, only slower; one an index reading clean does not list is missed
        if not listed:  # emptied, or tombstones alone: listings read the headers around it
            consequence = "it lists no root, and listings read every header around it, with a warning"
        elif problem is not None:
            consequence = "its damage is read around, from the headers"
        else:
            consequence = "listings miss it"
        for root in sorted(tops - listed):
            findings.append({"id": root, "kind": "index-missing", "detail": "top-level session absent from index/roots: "
                             f"{consequence} (run `subagents store reindex`)"})
    indexed_parents = {n for n in names if is_valid_session_id(n)}
    for parent in sorted(indexed_parents | set(proven)):
        found = read_index(store, parent)
        for problem in found.problems:
            findings.append({"id": parent, "kind": "index-damaged", "detail": f"children index of {parent}: {problem} (run `subagents store reindex`)"})
        indexed = {e.id for e in found.entries}
        findings.extend(_stale_rows(store, parent, found.entries, repair=repair))
        for child in sorted(proven.get(parent, set()) - indexed):
            if not found.needs_reindex and evidence_of_use(store, child, has_children=child in proven) is None:
                findings.append({"id": child, "kind": "unacknowledged", "detail": f"child of {parent} by its header, absent from "
                                 "the index and never used: a creation interrupted before its index entry, whose id was never "
                                 "given out (harmless; `subagents store reindex` leaves it out, `--keep-unacknowledged` lists it)"})
                continue
            findings.append({"id": child, "kind": "index-missing", "detail": f"child of {parent} by its header, absent from the index (run `subagents store reindex`)"})
        for child in sorted(indexed - proven.get(parent, set())):
            if store.in_trash(child):
                findings.append({"id": child, "kind": "collecting", "detail": f"indexed under {parent}, removed by a gc that was interrupted (harmless; the next `subagents gc` drops the entry)"})
                continue
            if child in unreadable:
                # not stale: the index is all that still says where this damaged session belongs
                findings.append({"id": child, "kind": "index-unproven", "detail": f"indexed under {parent}; its header does not "
                                 "read (reported above), so the entry is kept: `subagents store reindex` keeps it, and "
                                 "listings show the session as damaged until its file is restored or removed"})
                continue
            if _header_names(store, child, parent):
                continue  # created after ``sessions/`` was listed (a host at work beside fsck): not stale
            findings.append({"id": child, "kind": "index-stale", "detail": f"indexed under {parent} but no header proves it (harmless; `subagents store reindex` drops it)"})
    for session_id, loop in sorted(parent_loops(parent_of).items()):
        findings.append({"id": session_id, "kind": "parent-cycle", "detail": f"its header's parents loop ({' → '.join(loop)}): "
                         "no listing reaches it and no gc collects it (restore the headers' files, or remove these "
                         "sessions' files by hand)"})
    present = set(session_ids)
    for parent in sorted(set(proven) - present):
        if store.exists(parent):
            continue  # created since ``sessions/`` was listed
        for child in sorted(proven[parent]):
            # ``store check`` said so; fsck was silent and exited 0 while no listing showed the child
            findings.append({"id": child, "kind": "parent-missing", "detail": f"its header names parent {parent}, which the "
                             "store does not hold: no listing reaches it and no gc collects it (restore the parent's file, "
                             "or remove this session's files by hand)"})
    return findings


def _stale_rows(store: Store, parent: str, entries: list[IndexEntry], *, repair: bool) -> list[dict[str, Any]]:
    """``settled`` rows that say ``has_children`` false of a child whose own index lists a subagent child:
    a child started under it once it had settled, by a version that left the row as it was (FORMAT.md
    §9). Listings then say it has none, and ``store check`` reports ``index-row``. ``repair`` appends
    the row again, under the child's lock, with ``has_children`` true (``store/rows.py``)."""
    findings: list[dict[str, Any]] = []
    for entry in entries:
        if entry.settled is None or entry.settled.has_children is not False or not has_subagent_children(store, entry.id):
            continue
        finding: dict[str, Any] = {"id": entry.id, "kind": "row-stale", "detail": f"its settled row in the children index "
                                   f"of {parent} says it has no children; its own index lists some (a child created under "
                                   "it after it settled): listings say it has none (`subagents store fsck --repair` "
                                   "writes the row again)"}
        if repair:
            try:
                done = repair_has_children(store, entry.id)
            except (SubagentError, OSError) as exc:
                finding["repair"] = f"not repaired: {exc}"
            else:
                finding["repair"] = "row written again, has_children true" if done else "not repaired: the row changed meanwhile"
            finding["repaired"] = finding["repair"].startswith("row written")
        findings.append(finding)
    return findings


def _header_names(store: Store, child: str, parent: str) -> bool:
    """Whether ``child``'s header, read now, names ``parent``."""
    try:
        return read_header(store, child).parent_session == parent
    except SubagentError:
        return False
