"""Creating and removing sessions.

Creation is all-or-nothing: a session exists exactly when its file
``sessions/<id>`` does (``store/session_file.py``). The whole file — header,
lease (when created held), initial log (descriptor and policy events at epoch
0) — is written unnamed (or under a temporary name where the system has no
unnamed files), published by an exclusive ``link`` to its name (two creators
of one id cannot both win; ``atomic.NewFile``), then fsync'd: one inode per
session, none freed. The index entry follows. A crash before the link leaves
no name, or a temporary file that nothing lists (``subagents store fsck``
reports it); a failure after it unlinks the session and tombstones the index
entry.

The fsync follows the link, not the other way round: an unnamed file's inode
has a link count of 0, and an fsync before the link writes it so; the link's
count then stays in memory (the folder's fsync writes the folder, not the
file's inode). On a file system without a journal (ext4 made without one)
nothing else wrote that inode before a power loss, and the sessions created
last pointed at a deleted inode afterwards: unreadable, and cleared by
``e2fsck`` (``tests/crash/test_power_loss.py`` copies a loop device's image to
see what a power loss leaves). The price of the order: a power loss between a
link and its fsync — a creation that has not returned, that nobody was given
— can leave a name whose file is empty (``fsck`` reports it).

``create_sessions`` creates several sessions as one batch, with the same
order for each, and shares what a batch can share: one fsync of the
``sessions`` folder after every file is published, and one locked, fsynced
index append per parent for all of its new children. Each request succeeds or
fails on its own; a failure of a shared step fails (and rolls back) exactly
the sessions it covered. Its two halves are public (``publish_sessions``,
then ``commit_sessions``) so that a caller can publish in several threads and
commit what they published together (``supervisor/creator.py``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Sequence

from .atomic import NewFile, fsync_dir, remove_durably, write_unnamed
from .concurrent_sync import ConcurrentSync
from .errors import NO_DESCRIPTOR_LEFT, OUT_OF_DESCRIPTORS, DurabilityError, OutOfMemoryError, SessionExistsError, SessionNotFoundError, SubagentError
from .framing import encode_record
from .header import SessionHeader, parse_header
from .ids import is_valid_session_id, validate_session_id
from .descriptor import ContinuableDescriptor, OneShotDescriptor
from .index import IndexEntry, add_child, add_children, drop_index, prepare_index, remove_child
from .lease import Lease, LeaseState
from .locks import PinnedLock
from .projection import Projection
from .root import COMPANIONS, Store
from .rows import children_row
from .roots import add_root, remove_root
from .seed import seed_rows
from .session_file import block_padding, encode_session

__all__ = ["NewSession", "CreatedSession", "create_session", "create_sessions", "publish_sessions", "commit_sessions", "delete_session"]


@dataclass
class NewSession:
    """One creation request of ``create_sessions`` (the keywords of ``create_session``)."""

    session_id: str
    parent_session: str | None = None
    origin: str | None = None
    delegation_depth: int = 0
    seed: Sequence[dict[str, Any]] = ()
    events: Sequence[tuple[str, Any]] = ()
    cwd: str | None = None
    created_at: float | None = None
    lease_owner: str | None = None
    lease_state: LeaseState = "running"  # of the lease ``lease_owner`` is created with (a root opened by a host: idle)
    label: str | None = None
    # the id was generated for this creation (``IdGenerator``) and never handed out: no former
    # session of it can have left companion files, so creation does not look for them (three
    # failing unlinks per session; a supervisor's children are all created this way)
    fresh_id: bool = False

    def header(self) -> SessionHeader:
        """The header this creation publishes (``created_at`` now unless given); ``InvalidSessionIdError`` first."""
        validate_session_id(self.session_id)
        record: dict[str, Any] = {"version": 1, "id": self.session_id, "created_at": time.time() if self.created_at is None else self.created_at}
        if self.parent_session is not None:
            record["parent_session"] = self.parent_session
        if self.origin is not None:
            record["origin"] = self.origin
        record["delegation_depth"] = self.delegation_depth
        if self.seed:
            record["seed_length"] = len(self.seed)
        if self.cwd is not None:
            record["cwd"] = self.cwd
        if self.label is not None:
            record["label"] = self.label
        return parse_header(record)


def create_session(
    store: Store,
    session_id: str,
    *,
    parent_session: str | None = None,
    origin: str | None = None,
    delegation_depth: int = 0,
    seed: Sequence[dict[str, Any]] = (),
    events: Sequence[tuple[str, Any]] = (),
    cwd: str | None = None,
    created_at: float | None = None,
    lease_owner: str | None = None,
    lease_state: LeaseState = "running",
    label: str | None = None,
) -> SessionHeader:
    """Create a session with its seed (events inherited from a parent) and first events.

    Every check happens before the first byte is written. ``lease_owner``
    creates the session already leased to that owner at epoch 1 (state
    ``lease_state``): no other process can have seen the session yet, so no
    lock or takeover check is needed, it saves the lease's own fsyncs, and
    no ``gc`` can take the session between its creation and its lease.
    """
    request = NewSession(
        session_id, parent_session=parent_session, origin=origin, delegation_depth=delegation_depth, seed=seed, events=events,
        cwd=cwd, created_at=created_at, lease_owner=lease_owner, lease_state=lease_state, label=label,
    )
    [outcome] = create_sessions(store, [request])
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


@dataclass(frozen=True)
class CreatedSession:
    """A published session: its header and the projection of the log it was created with.

    The projection is what ``LogWriter.attach`` resumes from: the supervisor
    hands it to the worker that runs the session's first turn, which then
    reads nothing of the session to append to it.
    """

    header: SessionHeader
    projection: Projection

    @property
    def id(self) -> str:
        return self.header.id


def create_sessions(store: Store, requests: Sequence[NewSession]) -> list[SessionHeader | BaseException]:
    """Create every requested session; per request, its header or the error that stopped it.

    A request that fails leaves no trace (no file, no live index entry);
    the others are unaffected unless they shared the failed step.
    """
    outcomes = commit_sessions(store, requests, publish_sessions(store, requests))
    return [o if isinstance(o, BaseException) else o.header for o in outcomes]


def create_under_settled_parent(store: Store, request: NewSession) -> CreatedSession:
    """Create one child under its parent's session lock (the ``PinnedLock`` ``gc`` and ``acquire_lease``
    take), for a parent no live lease of the caller's holds.

    ``gc`` may be collecting such a parent's subtree: it locks each session of it, re-reads the
    parent's children index under that lock, and renames the subtree away. A child published and
    indexed outside the lock could fall between the re-read and the rename, and outlive its parent
    (listed nowhere, never collected). Under the lock, from the header's publication to its index
    entry, the child is either in the index when ``gc`` looks (the subtree stays) or created after
    ``gc`` moved the parent away (``SessionNotFoundError`` for the parent, nothing written). A parent
    this process holds a live lease on needs none of this: ``gc`` keeps a held subtree.

    The same lock keeps the parent's own row true (FORMAT.md §9; ``children_row``, which
    ``commit_sessions`` runs under the lock held here). A parent that has settled has a ``settled``
    row in its parent's children index, which may say ``has_children`` false; its first child would
    make that row lie (``store check``: ``index-row``; listings: no children). So such a row is marked
    ``active`` (durably) before the child is indexed, and appended again with ``has_children`` true
    once it is: the latest state record is the row. A kill between leaves the row ``active``, listed
    from the parent's files (right, with or without the child); a failed creation leaves it so too.
    A parent whose row already says it has children (every later child) costs one read of that
    index, and no write.
    """
    parent = request.parent_session
    assert parent is not None, "a child has a parent"
    try:
        lock = PinnedLock(store.session_path(parent), create=False)
        lock.acquire()
    except FileNotFoundError:  # gone already, or moved to the trash while we waited
        raise SessionNotFoundError(parent) from None
    try:
        outcome = commit_sessions(store, [request], publish_sessions(store, [request]), locked_parent=parent)[0]
    finally:
        lock.release()
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


# without threads: the fsyncs of a batch one after another, in the caller's thread
_IN_TURN = ConcurrentSync(threads=0)


def publish_sessions(
    store: Store, requests: Sequence[NewSession], *, syncs: ConcurrentSync | None = None,
) -> list[CreatedSession | BaseException]:
    """The first half of ``create_sessions``: each session's file and header, published.

    In three passes over the batch: write every file unnamed, name each,
    then fsync each (after its link: see the module docstring), so no fsync
    waits behind another file's write or link.

    ``syncs``: the fsyncs of the batch are issued at once on its threads (``concurrent_sync.py``),
    not one after another; every one has ended before this returns.

    Not yet durable as a whole: the names in ``sessions/`` are not fsynced and
    no index lists the new sessions until ``commit_sessions`` ran over these
    outcomes; nothing may hand a session out before. Several publications can
    run at once (in different threads) and meet in one commit.
    """
    outcomes: list[CreatedSession | BaseException | None] = [None] * len(requests)
    written: list[tuple[int, NewFile, CreatedSession]] = []
    published: list[int] = []
    held = _held_parents(store, requests)
    try:
        for i, request in enumerate(requests):
            try:
                header = request.header()
                if header.parent_session is not None and header.parent_session not in held:
                    raise SessionNotFoundError(header.parent_session)
                projection, blob = _encode_new_session(store, request, header)
                new_file = write_unnamed(store.session_path(request.session_id), blob)
            except Exception as exc:  # reported per request; the batch goes on
                outcomes[i] = exc
                continue
            written.append((i, new_file, CreatedSession(header, projection)))
        for i, new_file, created in written:
            try:
                _publish(store, requests[i], new_file)
            except Exception as exc:
                outcomes[i] = exc
            else:
                outcomes[i] = created
                published.append(i)
        if store.durability.syncs_at_commit:
            # data and inode, its link count included; commit_sessions' folder fsync, the name
            linked = [(i, new_file) for i, new_file, _ in written if i in published]
            files = [new_file for _, new_file in linked]
            failures = (syncs or _IN_TURN).sync_all(files)
            for (i, _), failure in zip(linked, failures):
                if failure is not None:
                    published.remove(i)
                    _rollback(store, requests[i], indexed=False)
                    outcomes[i] = failure
    except BaseException:
        # an interrupt, not a failure of one request: nothing of the batch is
        # reported created, so nothing of it may stay
        for j in published:
            _rollback(store, requests[j], indexed=False)
        raise
    finally:
        for _, new_file, _ in written:
            new_file.discard()
    done = [_reported(requests[i], o) for i, o in enumerate(outcomes) if o is not None]
    assert len(done) == len(requests), "every request has an outcome"
    return done


def _held_parents(store: Store, requests: Sequence[NewSession]) -> set[str]:
    """The parents of the batch the store holds, one look per parent. A child of a parent it does not
    hold (a mistaken id, a session naming itself, a parent made in the same batch and so not yet
    created) would be listed by no listing and collected by no gc: it is refused, nothing written."""
    parents = {r.parent_session for r in requests if is_valid_session_id(r.parent_session)}
    return {parent for parent in parents if store.exists(parent)}


def _reported(request: NewSession, outcome: CreatedSession | BaseException) -> CreatedSession | BaseException:
    """A creation's outcome as its caller gets it: a file system's refusal (no space, no inode left)
    as ``DurabilityError`` naming the session, not a bare ``OSError``; the store's own errors as they are.
    No descriptor left (``OUT_OF_DESCRIPTORS``) is no disk fault: the text says which limit to raise, and
    ``out_of_descriptors`` lets a caller tell it apart (the same call succeeds once descriptors are back)."""
    if isinstance(outcome, OSError) and not isinstance(outcome, SubagentError):
        fields: dict[str, Any] = {"session_id": request.session_id}
        hint = ""
        if outcome.errno in OUT_OF_DESCRIPTORS:
            fields["out_of_descriptors"], hint = True, f" ({NO_DESCRIPTOR_LEFT})"
        failure = DurabilityError(f'creating session "{request.session_id}" failed: {outcome}{hint}', **fields)
        failure.__cause__ = outcome
        return failure
    return outcome


def commit_sessions(
    store: Store, requests: Sequence[NewSession], outcomes: Sequence[CreatedSession | BaseException],
    *, locked_parent: str | None = None,
) -> list[CreatedSession | BaseException]:
    """The second half of ``create_sessions``, shared by every session published in ``outcomes``.

    One fsync of ``sessions/`` persists every new session's name; then one
    locked, fsynced index append per parent lists all of its new children
    (a root is added to the roots index, and its children index is made, empty,
    so that its first child adds one file like every later one). A session is created — and may be
    handed out — once this returns it; a shared step that fails rolls back
    exactly the sessions it covered and reports its error for each.

    A parent that is itself a subagent child keeps its row true (``children_row``): its append
    runs under its session lock, which the caller may already hold (``locked_parent``).
    """
    outcomes = list(outcomes)
    published = [i for i, o in enumerate(outcomes) if not isinstance(o, BaseException)]
    if not published:
        return outcomes
    indexed: set[int] = set()
    try:
        if store.durability.syncs_at_commit:
            try:
                # one fsync persists the names of every session file published above
                fsync_dir(store.sessions_dir)
            except Exception as exc:
                for i in published:
                    _rollback(store, requests[i], indexed=False)
                    outcomes[i] = exc
                return outcomes
        by_parent: dict[str, list[int]] = {}
        for i in published:
            parent = requests[i].parent_session
            if parent is not None:
                by_parent.setdefault(parent, []).append(i)
            else:
                created = outcomes[i]
                assert isinstance(created, CreatedSession)
                try:
                    add_root(store, created.header.id, created.header.created_at)
                except Exception as exc:
                    _rollback(store, requests[i], indexed=False)
                    outcomes[i] = exc
                else:
                    indexed.add(i)
                    prepare_index(store, created.header.id)
        for parent, members in by_parent.items():
            entries = []
            for i in members:
                created = outcomes[i]
                assert isinstance(created, CreatedSession)
                header = created.header
                entries.append(IndexEntry(header.id, header.created_at, header.origin, *_row_fields(created)))
            try:
                with children_row(store, parent, adding=True, locked=parent == locked_parent) as listed:
                    if len(entries) == 1:
                        one = entries[0]
                        add_child(store, parent, one.id, created_at=one.created_at, origin=one.origin, mode=one.mode, label=one.label)
                    else:
                        add_children(store, parent, entries)
                    listed()
            except Exception as exc:
                for i in members:
                    _rollback(store, requests[i], indexed=True, locked_parent=locked_parent)
                    outcomes[i] = exc
            else:
                indexed.update(members)
    except BaseException:
        # an interrupt: nothing of the batch is reported created, so nothing of it may stay
        for i in published:
            if not isinstance(outcomes[i], BaseException):
                _rollback(store, requests[i], indexed=i in indexed, locked_parent=locked_parent)
        raise
    return [_reported(request, outcome) for request, outcome in zip(requests, outcomes)]


def _encode_new_session(store: Store, request: NewSession, header: SessionHeader) -> tuple[Projection, bytes]:
    """The new session's whole file, and the projection of the log in it."""
    now = time.time()
    seed = request.seed
    projection = Projection(seed_length=len(seed))
    chunks: list[bytes] = []
    offset = 0
    rows = seed_rows(seed, now)  # INVALID_RECORD for an event a reader would refuse, before any file exists
    rows += [{"seq": len(seed) + i, "ts": now, "type": kind, "data": data, "epoch": 0} for i, (kind, data) in enumerate(request.events)]
    for row in rows:
        # framed before any file exists: a record above the limit leaves no trace
        chunk = encode_record(row, limit=store.max_record_bytes, what=f'a "{row["type"]}" event', event=row["type"])
        projection.apply(row, offset, offset + len(chunk))
        chunks.append(chunk)
        offset += len(chunk)
    lease = Lease(request.lease_owner, 1, request.lease_state, now) if request.lease_owner is not None else None
    try:
        blob = encode_session(header.to_record(), lease, b"".join(chunks), limit=store.max_record_bytes)
        return projection, blob + block_padding(len(blob))  # the first appends then write in place (session_file.py)
    except OutOfMemoryError:
        raise
    except MemoryError as exc:  # its records framed, its file not built: no file exists yet, nothing was written
        raise OutOfMemoryError(f"the new session {request.session_id}") from exc


def _publish(store: Store, request: NewSession, new_file: NewFile) -> None:
    """Name a written (and synced) session file; a former session's companions go."""
    try:
        new_file.publish()
    except FileExistsError:  # the link refuses a taken name: no check of our own before it
        raise SessionExistsError(request.session_id) from None
    if request.fresh_id:
        return
    try:
        _clear_companions(store, request.session_id, new_file)
    except BaseException:
        _rollback(store, request, indexed=False)
        raise


def _clear_companions(store: Store, session_id: str, new_file: NewFile | None = None) -> None:
    """Remove companion files an earlier session of this id left (a ``gc`` that crashed between
    moving a session and its companions): a new session starts with none. Nothing else can
    have made them yet: the id is not handed out before creation returns.

    Durably (FORMAT.md §1, Removals): the creation's own fsync of ``sessions/`` made the removal
    durable, but not the inode it freed, still written as in use with no name (the boot's
    ``e2fsck -p`` stopped at it). That removal's fsync of ``sessions/`` also writes the name of
    ``new_file``, the new session's file just published: it is fsync'd first (its inode with its
    link count), as ``publish_sessions`` would after, so no power loss leaves that name naming an
    inode never written. Costs nothing when there is no companion (the usual case)."""
    found = [path for path in (store.path(session_id, name) for name in COMPANIONS) if os.path.lexists(path)]
    if not found:
        return
    if new_file is not None and store.durability.syncs_at_commit:
        new_file.sync()
    remove_durably(found, durable=store.durability.syncs_at_commit)


def _row_fields(created: CreatedSession) -> tuple[str | None, str | None]:
    """The catalog row's static ``(mode, label)`` for a new session's index entry: from the
    identity its creation events give it, for a subagent child whose descriptor is valid, else
    ``(None, None)`` (listed from its files)."""
    ident = created.projection.identity
    if created.header.origin == "subagent" and isinstance(ident, (OneShotDescriptor, ContinuableDescriptor)):
        return ident.mode, ident.label
    return None, None


def _rollback(store: Store, request: NewSession, *, indexed: bool, locked_parent: str | None = None) -> None:
    """Undo one creation, best effort: the error that caused it is the one reported.

    A failing tombstone is left to the catalog (it checks every entry's header);
    the companions are still removed. Only if the session's file itself cannot
    be unlinked does the session stay (a double fault the caller cannot repair either).
    """
    try:
        delete_session(store, request.session_id, parent_session=request.parent_session if indexed else None,
                       root=indexed and request.parent_session is None, locked_parent=locked_parent)
    except Exception:
        try:
            delete_session(store, request.session_id)
        except Exception:
            pass


def delete_session(
    store: Store, session_id: str, *, parent_session: str | None = None, root: bool = False, locked_parent: str | None = None,
) -> None:
    """Remove a session that was never handed out (rollback); tombstones its index entry
    (the parent's, or with ``root`` the roots index). The parent's row stays true (``children_row``,
    under the parent's session lock, which the caller may hold: ``locked_parent``)."""
    # unpublish first: from here nothing lists it; durably, or after a power loss the name could come
    # back naming whatever file took the inode since (a damaged session in the way of gc)
    remove_durably([store.session_path(session_id)], durable=store.durability.syncs_at_commit)
    if parent_session is not None:
        with children_row(store, parent_session, adding=False, locked=parent_session == locked_parent) as listed:
            remove_child(store, parent_session, session_id)
            listed()
    elif root:
        remove_root(store, session_id)
        drop_index(store, session_id)  # the empty one ``commit_sessions`` prepared
    _clear_companions(store, session_id)
