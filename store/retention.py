"""Retention: ``collect`` deletes old, settled top-level subtrees, child-first (``subagents gc``).

A subtree is a top-level session and every session whose header descends from
it (subagents and forks). It is collected whole or not at all: when every
session of it is settled (no live lease, no undelivered mail, readable) and
its **last activity** is older than the cutoff. Last activity is the newest
modification time of any file of any session of the subtree: every append,
acceptance, control request, lease change and settlement (a release rewrites
the lease) moves it; reads never do. Creation time plays no part.

Deleting a session is one ``rename`` of its file into a folder
``trash/<id>.<hex>/`` (same file system): from that instant it does not exist
under ``sessions/``. Its companion files (mailbox, control, identity cache)
follow it there. Then the index entries go, then the trash folder. A crash
leaves every session whole or gone, plus at worst trash folders, index
entries of trashed sessions, which readers skip and ``check``/``fsck`` name as
an interrupted gc (the next ``collect`` finishes that first: ``_finish``), and
companions that did not follow, which nothing reads (``fsck`` reports them; the
next ``collect`` moves them after their session, ``_follow``, unless a new
session of that id exists, whose creation removed them).

Races: ``collect`` takes every session lock of a subtree (``PinnedLock``, the
lock ``acquire_lease`` takes), parents first, re-checks each session under
it, and renames them all before letting go. A re-activation (a ``send`` that
resumes an old child, ``open_root`` of an old root) that takes a lock first
holds a live lease when ``collect`` looks: the subtree stays. One that comes
after finds the session gone (``SESSION_NOT_FOUND``). Two ``collect`` calls
on one store run one after the other (``trash/.lock``). Last, the records
of crashed supervisors that hold no lease leave ``owners/`` (``reap_owners``).
Called by
``subagents gc`` and ``Supervisor.gc``. (Over 400 lines: the plan, the locked
re-check, the renames and the crash recovery share their invariants and read
best in one place.)
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import resource
import secrets
import stat
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Literal, TypeVar

from .atomic import DIR_MODE, Removal, fsync_dir, make_dirs
from .committed import CommittedEnds
from .description import mailbox_counts
from .steps import Steps
from .errors import REFUSED, DurabilityError, InvalidQueryError, LockTimeoutError, StoreFormatError, SubagentError, out_of_room
from .header import SessionHeader, parse_header
from .ids import is_valid_session_id
from .index import drop_index, indexed_children, mark_all_active, read_children, remove_child
from .lease import check_lease, host_identity, owner_alive, owner_record_unreadable, process_start_time, read_owner
from .leftovers import remove_leftovers
from .reaper import reap_owners
from .records import finite_number
from .reserve import keep_reserve, reserve_path, spend_reserve
from .locks import PinnedLock
from .log import read_projection
from .outcome import OUTCOMES, outcome_of
from .projection import Projection
from .reader import committed_damage, inspect, read_header
from .root import COMPANIONS, GC_LOCK_NAME, SET_ASIDE_PREFIX, Store
from .session_file import SessionFile
from .roots import compact_roots, indexed_roots, remove_roots, roots_index_path

__all__ = ["SkipReason", "CollectedRoot", "SkippedRoot", "GcReport", "collect", "age_seconds", "parse_age", "KILL_AFTER_ENV"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# test-only: SIGKILL this process right after its N-th change (``Steps``), so crash tests can stop it at every step
KILL_AFTER_ENV = "SUBAGENTS_GC_KILL_AFTER"

SkipReason = Literal["held", "mail", "unreadable", "unwritable", "busy", "changed", "too-large"]

# sessions renamed to the trash before one fsync of the two folders, the index updates and the
# removal of their trash folders: bounds the trash a crash leaves, and shares the fsyncs
_BATCH_SESSIONS = 512
# with the store's reserve spent (the disk had no room), sessions moved before their deletion: it
# frees their space while the reserve still holds room for the deletion's own index appends
_LOW_ROOM_BATCH = 16
# descriptors kept free while a subtree's locks are held (each lock is one open file)
_FD_MARGIN = 64
_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
# an age: ASCII digits with an optional fraction (or a fraction alone), then a unit; no sign, exponent, underscore
# or space, which ``float`` takes (``1e3d``, ``1_000d``, ``1 d``) and a reader would not expect
_AGE = re.compile(r"([0-9]+(?:\.[0-9]+)?|\.[0-9]+)(s|min|m|h|d|w)")
# the longest age parse_age takes: older than any store, and short enough that the cutoff is a
# date a report can print (an age of 2,000 years puts it before the year 1)
MAX_AGE_S = 1000 * 365.25 * 86400.0


@dataclass(frozen=True)
class CollectedRoot:
    """A subtree deleted (or, in a dry run, that would be)."""

    id: str
    label: str | None
    outcome: str | None  # the root's outcome (store/outcome.py); None: it never finished a turn
    sessions: int  # the root and every session below it
    bytes: int  # their files' sizes
    last_active: float  # the newest modification time in the subtree


@dataclass(frozen=True)
class SkippedRoot:
    """An old subtree kept, and the session of it that kept it."""

    id: str
    label: str | None
    session: str
    reason: SkipReason
    detail: str


@dataclass(frozen=True)
class GcReport:
    store: str
    older_than_s: float
    cutoff: float  # subtrees last active before this moment are old
    dry_run: bool
    outcomes: tuple[str, ...]  # the root outcomes asked for; empty: any
    collected: tuple[CollectedRoot, ...] = ()
    skipped: tuple[SkippedRoot, ...] = ()
    young: int = 0  # roots kept: their subtree was active after the cutoff
    other_outcome: int = 0  # old roots kept: their outcome was not asked for
    finished: int = 0  # trash folders an interrupted gc left, emptied first (a dry run: that are there)
    set_aside: int = 0  # other programs' folders gc found in its way and left in trash/ (``Store.set_aside``)
    owners_removed: int = 0  # records of crashed supervisors that held nothing (``reap_owners``; a dry run: that would go)
    leftovers_removed: int = 0  # temporary names of writes a kill interrupted (``store/leftovers.py``; a dry run: that would go)
    reserve_spent: bool = False  # the disk had no room left: this gc spent the store's reserve (``store/reserve.py``)
    reserve_kept: bool = False  # the reserve is there at the end (made again when the disk had room to spare)
    elapsed_s: float = 0.0

    @property
    def sessions(self) -> int:
        return sum(c.sessions for c in self.collected)

    @property
    def bytes(self) -> int:
        return sum(c.bytes for c in self.collected)


def age_seconds(text: str) -> float | None:
    """The seconds of ``text`` if it is an age, else ``None``: the one grammar of ``gc --older-than`` and of
    ``ls --since`` (which reads what is no age as a date). ``InvalidQueryError`` for an age longer than
    ``MAX_AGE_S``: a cutoff before the year 1 is no date a report can print."""
    match = _AGE.fullmatch(text)
    if match is None:
        return None
    seconds = float(match[1]) * _UNITS[match[2]]  # digits past the largest float read as inf: longer, not "no age"
    if seconds > MAX_AGE_S:
        raise InvalidQueryError(f"{text!r} is longer than 1000 years")
    return seconds


def parse_age(text: str) -> float:
    """``30s``, ``15m`` (or ``15min``), ``12h``, ``7d``, ``2w``, ``1.5h``, ``.5h`` in seconds; ``InvalidQueryError`` otherwise."""
    if not isinstance(text, str):
        raise InvalidQueryError(f"an age is text such as 30s, 15m, 12h, 7d or 2w, not {type(text).__name__}")
    seconds = age_seconds(text)
    if seconds is None:
        raise InvalidQueryError(f"{text!r} is not an age such as 30s, 15m, 12h, 7d or 2w")
    return seconds


@dataclass
class _Plan:
    """One old subtree that passed every check without locks: what is about to go."""

    root: SessionHeader
    order: list[str]  # pre-order: every parent before its children
    outcome: str | None
    last_active: float
    bytes: int


@dataclass
class _Pass:
    store: Store
    cutoff: float
    host: str = field(default_factory=host_identity)
    owners: dict[str, bool | None] = field(default_factory=dict)  # None: its record is there but does not read
    committed: CommittedEnds = field(init=False)

    def __post_init__(self) -> None:
        self.committed = CommittedEnds(self.store)

    def holder(self, session_id: str) -> tuple[SkipReason, str] | None:
        """Why a live supervisor may hold the session (``held``, or ``unreadable`` when its owner's
        record is there but does not read), or ``None``. ``CorruptSessionError`` for a damaged lease.

        Stricter than ``session_status``: an owner whose heartbeat is late but whose process
        still runs on this host (stopped, or hung) still holds it; and an owner file that does not
        read proves neither a holder nor its death (a takeover may fence such a holder; a deletion
        cannot be undone).
        """
        lease = check_lease(self.store, session_id)
        if lease is None or lease.state == "released":
            return None
        if lease.owner not in self.owners:
            record = read_owner(self.store, lease.owner)
            if record is None and owner_record_unreadable(self.store, lease.owner):
                self.owners[lease.owner] = None
            else:
                running = (record is not None and record.host == self.host and record.pid_start is not None
                           and process_start_time(record.pid) == record.pid_start)
                self.owners[lease.owner] = owner_alive(record, host=self.host) or running
        alive = self.owners[lease.owner]
        if alive is None:
            return "unreadable", (f"{session_id} is leased by supervisor {lease.owner} (lease epoch {lease.epoch}), whose record "
                                  f"owners/{lease.owner} does not read: it may still run; see `subagents store fsck`")
        if not alive:
            return None
        return "held", f"{session_id} is {lease.state} under supervisor {lease.owner} (lease epoch {lease.epoch})"

    def examine(self, session_id: str, *, locked: bool = False) -> tuple[SkipReason | None, str, Projection | None]:
        """What keeps the session, if anything (reason and text), and its projection when it reads.
        ``locked``: the caller holds the session's lock (its mailbox is then read as its writers read it)."""
        try:
            projection = read_projection(self.store, session_id)  # CORRUPT_SESSION for a damaged committed turn/end
            held = self.holder(session_id)
            if held is None and projection.open_turn is not None:
                # settled with a turn open: a crash, or its ``turn/end`` zeroed (read like padding)
                found = self.committed.apply(inspect(self.store, session_id))
                if found.status == "corrupt" and found.damage is not None:
                    raise committed_damage(session_id, found.damage)
        except (SubagentError, OSError) as exc:
            code = getattr(exc, "code", type(exc).__name__)
            return "unreadable", f"{session_id} does not read ({code}: {getattr(exc, 'message', exc)}); see `subagents store fsck`", None
        if held is not None:
            return held[0], held[1], projection
        mail = mailbox_counts(self.store, session_id, projection, locked=locked)
        if mail.pending is None:
            return "unreadable", f"{session_id}: {mail.problem}", projection
        if mail.pending:
            return "mail", f"{session_id} has {mail.pending} undelivered message(s)", projection
        return None, "", projection


def _activity(store: Store, session_id: str) -> tuple[float, int]:
    """The newest modification time among the session's file and its companions, and their total size."""
    info = os.lstat(store.session_path(session_id))
    newest, size = info.st_mtime, info.st_size
    for name in COMPANIONS:
        try:
            info = os.lstat(store.path(session_id, name))
        except FileNotFoundError:
            continue
        newest, size = max(newest, info.st_mtime), size + info.st_size
    return newest, size


def _lineage(store: Store) -> tuple[dict[str, SessionHeader], dict[str, list[str]], dict[str, str]]:
    """Every readable header, parent → children by headers (the authority; the index is derived),
    and why each session whose header does not read does not (``fsck`` reports them too): a folder,
    link or FIFO in a session's place among them, so a root of that kind is reported kept."""
    headers: dict[str, SessionHeader] = {}
    children: dict[str, list[str]] = defaultdict(list)
    damaged: dict[str, str] = {}
    for session_id in store.session_ids(any_type=True):
        try:
            header = read_header(store, session_id)
        except (SubagentError, OSError) as exc:
            damaged[session_id] = f"{getattr(exc, 'code', type(exc).__name__)}: {getattr(exc, 'message', exc)}"
            continue  # its index entry, if any, keeps its parent's subtree (``_indexed_below``)
        headers[session_id] = header
        if header.parent_session is not None:
            children[header.parent_session].append(session_id)
    return headers, children, damaged


def _placed(store: Store, damaged: dict[str, str]) -> tuple[list[str], list[str]]:
    """The sessions whose header does not read, split into the roots ``index/roots`` lists and
    those no index places at all. A damaged session a children index lists holds back the
    subtree of its parent (``_plan``); one no index places may descend from any root, so it
    holds back every subtree: deleting one could leave it without its parent."""
    if not damaged:
        return [], []
    roots = indexed_roots(store) or set()
    listed = indexed_children(store)
    return ([sid for sid in damaged if sid in roots and sid not in listed],
            [sid for sid in damaged if sid not in roots and sid not in listed])


def _indexed_below(store: Store, node: str, headers: dict[str, SessionHeader]) -> list[str]:
    """Children the index lists under ``node`` that exist and whose header does not name another
    parent (one that does not read is kept: it holds its subtree back as unreadable)."""
    found = []
    for entry in read_children(store, node):
        header = headers.get(entry.id)
        if store.exists(entry.id) and (header is None or header.parent_session == node):
            found.append(entry.id)
    return found


def _subtree(store: Store, root: str, children: dict[str, list[str]], headers: dict[str, SessionHeader]) -> list[str]:
    """``root`` and its descendants in pre-order, by headers plus the index entries that may be children."""
    order: list[str] = []
    seen: set[str] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        order.append(node)
        below = list(children.get(node, ()))
        below += [sid for sid in _indexed_below(store, node, headers) if sid not in below]
        stack.extend(reversed(below))
    return order


def _plan(state: _Pass, root: SessionHeader, children: dict[str, list[str]], headers: dict[str, SessionHeader],
          outcomes: frozenset[str]) -> _Plan | SkippedRoot | Literal["young", "other"]:
    store = state.store
    order = _subtree(store, root.id, children, headers)
    newest, size = 0.0, 0
    for session_id in order:
        try:
            mtime, nbytes = _activity(store, session_id)
        except (SubagentError, OSError) as exc:
            return SkippedRoot(root.id, root.label, session_id, "unreadable", f"{session_id}: its files cannot be read ({exc})")
        newest, size = max(newest, mtime), size + nbytes
    if newest >= state.cutoff:
        return "young"
    reason, detail, projection = state.examine(root.id)
    outcome = None if projection is None else outcome_of(projection, held=reason == "held", root=True).outcome
    if outcomes and projection is not None and (outcome or "none") not in outcomes:
        return "other"
    for session_id in order:
        if session_id != root.id:
            if session_id not in headers:
                return SkippedRoot(root.id, root.label, session_id, "unreadable",
                                   f"{session_id} is indexed below {root.id} but its header does not read; see `subagents store fsck`")
            reason, detail, _ = state.examine(session_id)
        if reason is not None:
            return SkippedRoot(root.id, root.label, session_id, reason, detail)
    return _Plan(root, order, outcome, newest, size)


def _trash_name(session_id: str) -> str:
    return f"{session_id}.{secrets.token_hex(4)}"


class _Room:
    """What gc does when the disk has no room for its next trash folder or index append: first
    delete what it moved so far (``_settle``: their files' space comes back), else spend the store's
    reserve (``store/reserve.py``); neither left, the error stands (``collect`` says to free some
    space). Once the reserve is spent, what was moved is deleted every ``_LOW_ROOM_BATCH``
    sessions, so that deletion's own index appends still find room. Deleting in the middle of a
    subtree keeps the rule that one is collected whole or not at all: the locks of its sessions not
    yet moved are held throughout, and what is deleted first is its deepest sessions, as a crash
    would leave them."""

    def __init__(self, store: Store, steps: Steps) -> None:
        self._store = store
        self.batch: list[tuple[str, str]] = []  # (id, trash folder) moved and not deleted yet
        self._steps = steps
        self.spent = False  # the reserve, by this gc

    def attempt(self, action: Callable[[], T]) -> T:
        """``action()``, made room for and tried again as long as room can be made."""
        while True:
            try:
                return action()
            except OSError as exc:
                if not out_of_room(exc) or not self._make():
                    raise

    def moved(self) -> None:
        """A session is in the trash: with the reserve spent, delete the batch while room is left."""
        if self.spent and len(self.batch) >= _LOW_ROOM_BATCH:
            self.settle()

    def settle(self) -> None:
        """Delete what was moved (``_settle``), if anything."""
        if self.batch:
            _settle(self._store, self.batch, self._steps)
            self.batch.clear()

    def _make(self) -> bool:
        if self.batch:
            self.settle()
            return True
        if not self.spent and spend_reserve(self._store):
            self.spent = True
            return True
        return False


def _remove(store: Store, plan: _Plan, state: _Pass, limit: int, headers: dict[str, SessionHeader], steps: Steps,
            room: _Room) -> SkippedRoot | None:
    """Lock, re-check and rename one planned subtree into the trash, child-first, adding each
    (id, trash folder) to ``room.batch`` as it goes (``room`` may delete them meanwhile); the
    reason when the subtree stays."""
    root = plan.root
    if len(plan.order) > limit:
        return SkippedRoot(root.id, root.label, root.id, "too-large",
                           f"{len(plan.order)} sessions: more locks than this process may hold at once (raise `ulimit -n`)")
    planned = set(plan.order)
    for session_id in plan.order:  # gc appends to these indexes and drops them: another user's file keeps its subtree
        index = store.children_index_path(session_id)
        if os.path.lexists(index) and not os.access(index, os.W_OK):
            return _unwritable(plan, session_id, f"the children index of {session_id}", index)
    held: dict[str, PinnedLock] = {}
    with contextlib.ExitStack() as locks:
        for session_id in plan.order:
            try:
                held[session_id] = locks.enter_context(PinnedLock(store.session_path(session_id), create=False))
            except FileNotFoundError:
                return SkippedRoot(root.id, root.label, session_id, "changed", f"{session_id} was removed meanwhile")
            except LockTimeoutError as exc:
                return SkippedRoot(root.id, root.label, session_id, "busy", exc.message)
            except OSError as exc:
                if exc.errno not in REFUSED:
                    raise
                return _unwritable(plan, session_id, f"the file of {session_id}", store.session_path(session_id))
            if not store.exists(session_id):
                return SkippedRoot(root.id, root.label, session_id, "changed", f"{session_id} was removed meanwhile")
            reason, detail, _ = state.examine(session_id, locked=True)
            if reason is not None:
                return SkippedRoot(root.id, root.label, session_id, reason, detail)
            if _activity(store, session_id)[0] >= state.cutoff:
                return SkippedRoot(root.id, root.label, session_id, "changed", f"{session_id} was active meanwhile")
            added = [sid for sid in _indexed_below(store, session_id, headers) if sid not in planned]
            if added:
                return SkippedRoot(root.id, root.label, added[0], "changed", f"{added[0]} was created below {session_id} meanwhile")
        # every lock is held and every session checked under it: nothing can re-activate them now.
        # Rows that list a child as settled are cleared first (session lock, then index lock: the
        # store's lock order), so a listing of a parent a crash leaves behind reads the files instead
        for session_id in plan.order:
            rows = [e.id for e in read_children(store, session_id) if e.settled is not None and e.id in planned]
            if rows:
                room.attempt(functools.partial(mark_all_active, store, session_id, rows))
                steps.done()
        for session_id in reversed(plan.order):
            target = os.path.join(store.trash_dir, _trash_name(session_id))
            room.attempt(functools.partial(os.mkdir, target, DIR_MODE))
            steps.done()
            # the session's file first: from that rename on it is gone (its companions are only
            # read beside it; a crash before they follow leaves them unread, and a new session
            # of this id clears them at its creation)
            os.rename(store.session_path(session_id), os.path.join(target, _TRASHED_FILE))
            steps.done()
            for name in COMPANIONS:
                try:
                    os.rename(store.path(session_id, name), os.path.join(target, name))
                except FileNotFoundError:
                    continue
                steps.done()
            # its lock goes with it: nothing can lock a session gone from ``sessions/``, and the lock's
            # descriptor would keep its file's inode and block in use (and its trash folder's: the
            # file's name pins its folder) until the whole subtree is moved, while ``room`` may need
            # them back to go on
            held.pop(session_id).release()
            room.batch.append((session_id, target))
            room.moved()
    return None


# the name a session's file takes in its trash folder (its companions keep theirs)
_TRASHED_FILE = "session"


def _trash_header(session_id: str, folder: str) -> SessionHeader | None:
    try:
        with SessionFile.open(session_id, os.path.join(folder, _TRASHED_FILE)) as file:
            return parse_header(file.header_map)
    except Exception:  # a folder a crash left half made or half removed: nothing to forget from it
        return None


def _forget(store: Store, moved: Iterable[tuple[str, str]], steps: Steps) -> None:
    """The index updates of sessions now in the trash, then their trash folders; each step idempotent.

    Their indexes and trash folders are removed with one ``Removal`` (one fsync of ``index/children/``
    and of ``trash/`` per group, then one of each inode removed): held until those fsyncs, since a
    folder name that came back naming a new session's file would fail every later gc, one naming a
    new folder would have that folder emptied, and an index that came back would be read as the
    collected parent's (or be another file's)."""
    moved = [(session_id, folder) for session_id, folder in moved if not _foreign(store, folder, trash=True)]
    roots: list[str] = []
    with Removal(durable=store.durability.syncs_at_commit) as removal:
        for session_id, folder in moved:
            header = _trash_header(session_id, folder)
            index = store.children_index_path(session_id)
            if not _foreign(store, index, trash=False) and drop_index(store, session_id, removal=removal):
                steps.done()
            if header is None:
                continue
            if header.parent_session is None:
                roots.append(session_id)
            elif store.exists(header.parent_session):
                # only after a crash mid-subtree: its parent is still there (and is collected next)
                remove_child(store, header.parent_session, session_id, if_gone=True)
                steps.done()
        remove_roots(store, roots, if_gone=True)
        steps.done()
        for _, folder in moved:
            if removal.remove_each([folder], ignore_errors=True):
                steps.done()
    steps.done()


def _foreign(store: Store, path: str, *, trash: bool) -> bool:
    """Whether ``path``, a trash folder (``trash``) or a children index gc is about to remove,
    names a folder no gc or index writer made: then it is moved to ``trash/.foreign.<name>.<hex>``
    (which no gc lists) and left there, with a warning, for an operator.

    Such a folder is another program's. A gc killed inside a ``Removal`` frees the inodes it
    held at once, while their names are still on the disk until the folders that held them are
    fsync'd; a folder made meanwhile anywhere on the file system may take one of those inodes, and
    after a power loss the boot's ``e2fsck -y`` keeps one of the two names of that folder, which
    may be this one. Deleting it, as the next gc did (or failing on it, on every run), would
    delete that program's files. A name of a file (not a folder) is removed as usual: ``e2fsck``
    counts both of its names, and only this one goes."""
    if not _is_folder(path):
        return False
    if trash:
        try:
            names = os.listdir(path)
        except OSError:
            return False  # unreadable: removed as the removal can, or left with its error
        if set(names) <= {_TRASHED_FILE, *COMPANIONS}:
            return False
    aside = os.path.join(store.trash_dir, f"{SET_ASIDE_PREFIX}{os.path.basename(path)}.{secrets.token_hex(4)}")
    os.rename(path, aside)
    if store.durability.syncs_at_commit:
        fsync_dir(os.path.dirname(path))
        fsync_dir(store.trash_dir)
    log.warning("%s named a folder no gc made (another program's, after a power loss and e2fsck -y): moved to %s, "
                "not deleted", path, aside)
    return True


@contextlib.contextmanager
def _trash_in_place(store: Store) -> Iterator[None]:
    """``trash/`` or its lock (``trash/.lock``) that is not what gc keeps there, a hand edit's work:
    ``STORE_FORMAT`` naming it (as a layout folder that is a file is), not a bare OS error."""
    try:
        yield
    except (IsADirectoryError, NotADirectoryError, FileExistsError) as exc:
        what = exc.filename if isinstance(exc.filename, str) else store.trash_dir
        raise StoreFormatError(f"the store at {store.root} is damaged: {what} is not what gc keeps there "
                               f"(trash/ is a folder, trash/{GC_LOCK_NAME} a file): move it away", path=store.root) from None


def _require_own_trash(store: Store) -> None:
    """``STORE_FORMAT`` for a ``trash/`` that is a link or a file (``Store.trash_problem``), before gc reads
    it: gc removes what it finds there, and through a link it emptied the folder the link leads to."""
    problem = store.trash_problem()
    if problem is not None:
        raise StoreFormatError(f"the store at {store.root} is damaged: {problem}, which is not what gc keeps there "
                               f"(trash/ is a folder of the store's own; gc removes what it finds in it): move it away "
                               f"(gc makes a new one)", path=store.root)


def _trashed(store: Store) -> list[tuple[str, str]]:
    """(session id, folder) of everything in ``trash/``."""
    try:
        with _trash_in_place(store):
            names = sorted(os.listdir(store.trash_dir))
    except FileNotFoundError:
        return []
    entries = []
    for name in names:
        session_id, dot, _ = name.partition(".")
        if not name.startswith(".") and dot:
            entries.append((session_id, os.path.join(store.trash_dir, name)))
    return entries


def _finish(store: Store, steps: Steps) -> int:
    """Complete what an interrupted gc left in the trash; the number of folders emptied."""
    entries = _trashed(store)
    if entries:
        log.info("finishing an interrupted gc: %d folder(s) in %s", len(entries), store.trash_dir)
        for session_id, folder in entries:
            _follow(store, session_id, folder, steps)
        _forget(store, entries, steps)
    return len(entries)


def _follow(store: Store, session_id: str, folder: str, steps: Steps) -> None:
    """Move the companions a gc killed after moving a session's file left in ``sessions/`` into its
    trash folder; not when a session of that id exists again (they are its own: its creation
    removed the old ones)."""
    if not is_valid_session_id(session_id) or store.exists(session_id) or not _is_folder(folder):
        return  # a name of a file in the trash: a stale name (``_foreign``), removed as it is
    for name in COMPANIONS:
        try:
            os.rename(store.path(session_id, name), os.path.join(folder, name))
        except FileNotFoundError:
            continue
        steps.done()


def _is_folder(path: str) -> bool:
    """A folder itself (not a link to one); False when nothing is there."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _lock_budget() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(1, (soft if soft != resource.RLIM_INFINITY else 1 << 20) - _FD_MARGIN)


def collect(
    store: Store, older_than_s: float, *, outcomes: Iterable[str] = (), dry_run: bool = False, now: float | None = None,
) -> GcReport:
    """Delete every top-level subtree last active more than ``older_than_s`` ago whose sessions are all settled.

    ``outcomes`` keeps only roots with these outcomes (``OUTCOMES`` and ``"none"``, as ``ls --outcome``);
    ``dry_run`` changes nothing and reports what would go; ``now`` is the moment ages are taken from.
    Invalid arguments raise ``InvalidQueryError`` before anything is read. A disk without room for
    gc's trash folders (one per session collected) or its index appends is met by deleting what
    was moved so far, then by spending the store's reserve (``store/reserve.py``); with neither
    left it is ``DurabilityError``: what gc moved so far is whole, and the next gc, with a little
    space free, finishes it. The reserve is made again at the end when the disk has room to spare.
    """
    try:
        return _collect(store, older_than_s, outcomes=outcomes, dry_run=dry_run, now=now)
    except OSError as exc:
        if not out_of_room(exc):
            raise
        why = exc.message if isinstance(exc, SubagentError) else exc.strerror
        raise DurabilityError(f"gc found no room on the disk for its trash folders (one per session it collects; "
                              f"{why}) and the store's reserve for it is spent or was never made: free some space "
                              f"and run it again, the next gc finishes what this one began",
                              path=getattr(exc, "filename", None)) from exc


def _collect(
    store: Store, older_than_s: float, *, outcomes: Iterable[str], dry_run: bool, now: float | None,
) -> GcReport:
    started = time.monotonic()
    if not isinstance(dry_run, bool):  # any false value ran a real collection: ``dry_run=None`` deleted
        raise InvalidQueryError(f"dry_run must be True or False, not {dry_run!r}")
    _require_own_trash(store)
    if isinstance(outcomes, (str, bytes)):  # a string is iterable: "completed" was read as c, o, m, p, ...
        raise InvalidQueryError(f"outcomes must be a list of outcomes, not the string {outcomes!r}")
    if not isinstance(outcomes, Iterable):  # None, a number: a bare TypeError from frozenset() otherwise
        raise InvalidQueryError(f"outcomes must be a list of outcomes, not {type(outcomes).__name__}")
    words = list(outcomes)
    odd = [word for word in words if not isinstance(word, str)]
    if odd:  # a list in it is unhashable, a number fails sorted() and join() below: bare TypeErrors
        raise InvalidQueryError(f"outcomes must hold outcome words (text), not {type(odd[0]).__name__} {odd[0]!r}")
    wanted = frozenset(words)
    bad = sorted(wanted - {*OUTCOMES, "none"})
    if bad:
        raise InvalidQueryError(f"outcome {', '.join(bad)} is not one of {', '.join((*OUTCOMES, 'none'))}")
    if not finite_number(older_than_s) or older_than_s < 0:
        raise InvalidQueryError(f"older_than_s must be a non-negative number of seconds, not {older_than_s!r}")
    cutoff = (time.time() if now is None else now) - older_than_s
    state = _Pass(store, cutoff)
    steps = Steps(KILL_AFTER_ENV)
    room = _Room(store, steps)
    finished = len(_trashed(store)) if dry_run else 0
    with contextlib.ExitStack() as stack:
        if not dry_run:
            # every folder and index gc writes, before anything moves: a gc that could not record
            # its deletions would leave the trash and stale index entries behind
            store.require_index_files(roots_index_path(store))
            store.require_writable(store.index_dir, roots_index_path(store), store.trash_dir)
            with _trash_in_place(store):
                make_dirs(store.trash_dir, durable=store.durability.syncs_at_commit)
                # gc's lock, made with the reserve (or by the first gc: on a full disk, from the reserve)
                room.attempt(lambda: stack.enter_context(PinnedLock(os.path.join(store.trash_dir, GC_LOCK_NAME))))
            finished = room.attempt(lambda: _finish(store, steps))  # each of its steps can be done again
        headers, children, damaged = _lineage(store)
        damaged_roots, unplaced = _placed(store, damaged)
        plans: list[_Plan] = []
        skipped: list[SkippedRoot] = []
        young = other = 0
        for header in headers.values():
            if header.parent_session is not None:
                continue
            found = _plan(state, header, children, headers, wanted)
            if isinstance(found, _Plan) and unplaced:
                lost = unplaced[0]
                found = SkippedRoot(header.id, header.label, lost, "unreadable",
                                    f"{lost} does not read ({damaged[lost]}) and no index places it: it may descend from "
                                    f"{header.id}; see `subagents store fsck`")
            if found == "young":
                young += 1
            elif found == "other":
                other += 1
            elif isinstance(found, SkippedRoot):
                skipped.append(found)
            else:
                plans.append(found)
        for root_id in damaged_roots:
            if _activity(store, root_id)[0] >= cutoff:
                young += 1
            else:
                skipped.append(SkippedRoot(root_id, None, root_id, "unreadable",
                                           f"{root_id} does not read ({damaged[root_id]}); see `subagents store fsck`"))
        collected: list[CollectedRoot] = []
        if dry_run:
            collected = [_collected(p) for p in plans]
        else:
            collected, late = _delete(store, plans, state, headers, steps, room)
            skipped += late
            if collected or finished:
                _compact(store)
                steps.done()
        # last: a collected session no longer names its crashed owner
        owners_removed = len(reap_owners(store, dry_run=dry_run))
        leftovers_removed = remove_leftovers(store, dry_run=dry_run)
        reserve_kept = os.path.lexists(reserve_path(store)) if dry_run else keep_reserve(store)
    return GcReport(store.root, float(older_than_s), cutoff, dry_run, tuple(sorted(wanted)), tuple(collected), tuple(skipped),
                    young, other, finished, len(store.set_aside()), owners_removed, leftovers_removed,
                    room.spent, reserve_kept, time.monotonic() - started)


def _compact(store: Store) -> None:
    """``compact_roots``, which rewrites the roots index whole; on a disk with no room for that
    copy the index keeps its tombstones (listings read past them) until a gc with room."""
    try:
        compact_roots(store)
    except OSError as exc:
        if not out_of_room(exc):
            raise
        log.warning("the roots index was not compacted: no room on the disk for its copy (%s)", exc)


def _unwritable(plan: _Plan, session_id: str, what: str, path: str) -> SkippedRoot:
    """A subtree with a file this process may read and not write: another user's (a ``sudo`` run left it),
    or one mounted read-only on its own."""
    try:
        mounted = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        mounted = False
    why = "it is on a read-only file system" if mounted else "give the store's files back to its user to collect it"
    return SkippedRoot(plan.root.id, plan.root.label, session_id, "unwritable", f"{what} cannot be written by this process; {why}")


def _collected(plan: _Plan) -> CollectedRoot:
    return CollectedRoot(plan.root.id, plan.root.label, plan.outcome, len(plan.order), plan.bytes, plan.last_active)


def _delete(store: Store, plans: list[_Plan], state: _Pass, headers: dict[str, SessionHeader],
            steps: Steps, room: _Room) -> tuple[list[CollectedRoot], list[SkippedRoot]]:
    """Rename batches of subtrees into the trash, make the renames durable, then forget them."""
    collected: list[CollectedRoot] = []
    skipped: list[SkippedRoot] = []
    limit = _lock_budget()
    try:
        for plan in plans:
            kept = _remove(store, plan, state, limit, headers, steps, room)
            if kept is not None:
                skipped.append(kept)
                continue
            collected.append(_collected(plan))
            if len(room.batch) >= _BATCH_SESSIONS:
                room.settle()
    finally:
        room.settle()  # also after a failure: what is in the trash is gone, its index entries go too
    return collected, skipped


def _settle(store: Store, batch: list[tuple[str, str]], steps: Steps) -> None:
    if store.durability.syncs_at_commit:
        # the renames reach the disk before any index forgets them: a power loss never leaves
        # a session whose index entry is gone
        fsync_dir(store.sessions_dir)
        fsync_dir(store.trash_dir)
    steps.done()
    _forget(store, batch, steps)
