"""Converting a store of an older format version to version 4 in place (``subagents store migrate``).

**Version 3 to 4** changes no record: from version 4 the children indexes and
the roots index are their own locks (``store/index_file.py``), so the empty
``<name>.lock`` files beside them go. They are removed first (a kill leaves a
store of version 3, whose builds make a missing lock file again, and the next
run does the rest), then the marker is replaced atomically (``write_atomic``:
a kill leaves the old marker or the new one). A version-3 build refuses the new
marker: it would lock the files beside the indexes while this build locks the
indexes themselves, and the two would not exclude each other.

**Version 2 to 4** is the same: version 3 lets a session log and a mailbox end
in zero padding (FORMAT.md §3.4, §8), which no version-2 writer made, so every
version-2 file is a version-3 one as it is.

**Version 1 to 4** converts the sessions as below (the version-2 layout), then
removes the index lock files and writes the marker of version 4.

Version 1 keeps a session in a folder ``sessions/<id>/`` (header, log, lease, identity,
mailbox, control, ``.lock``); version 2 in one file ``sessions/<id>`` with its companions
beside it. Header and log bytes are copied as they are (log offsets are relative to the
log's start in both formats), a lease becomes slot 0 marked synced, companions are renamed.

**Invariant:** every session is, at every instant, whole in exactly one of three places,
and each run of ``migrate`` starts from what it finds, so a kill at any point leaves a
store the next run finishes: ``sessions/<id>/`` (not converted yet), ``sessions/.<id>.v1/``
(set aside; the converted file is written again from it), or the file ``sessions/<id>``
(converted: only the rest of ``.<id>.v1/`` remains to move or remove). Per session:
write ``sessions/.<id>.v2`` whole and fsync it; rename the folder to ``.<id>.v1``; rename
``.<id>.v2`` to ``<id>``; rename the companions out. Then one fsync of ``sessions/``, and
only then every ``.<id>.v1`` is removed.

**Removals:** a folder removed from ``sessions/`` (a ``.<id>.v1``, or a crashed creation's
``<id>``) and the files a version-1 trash entry drops are removed with ``remove_durably``, each
its own step: without a journal a removed name comes back after a power loss until its folder
is fsync'd, while the inode it named is free for any new file at once, and the next run must not
find such a name naming someone else's inode.

**Crash states:** the marker says ``migrating: 4`` (``migrating: 2`` or ``3`` when a build of
version 2 or 3 started the conversion: this one finishes it the same way) from the first change to the last
(``Store`` refuses it, naming this command); a stray ``.<id>.v2`` is rewritten or removed;
a folder without a header (a creation that crashed) is removed; a version-1 trash entry
gets its ``session`` file before its ``header`` goes (``gc`` then finishes it as usual).
The marker becomes ``version: 4`` only after ``sessions/`` and ``trash/`` are fsync'd.
Refused (``STORE_IN_USE``, nothing changed) while a supervisor's owner lives or another
``migrate`` runs. Who calls it: the CLI (``supervisor/cli/maintenance.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
from dataclasses import dataclass
from typing import Any, Iterator

import msgpack

from .atomic import fsync_dir, read_bytes, remove_durably, write_atomic, write_new
from .durability import Durability, durability_policy
from .steps import Steps
from .errors import ReadOnlyStoreError, StoreFormatError, SubagentError
from .framing import scan
from .ids import is_valid_session_id
from .lease import host_identity, owner_alive, process_start_time, read_owner_file
from .lease_record import Lease, decode_lease
from .root import COMPANIONS, STORE_FORMAT, STORE_VERSION, layout_damage, marker_present, missing_marker, read_marker
from .session_file import encode_session

__all__ = ["MigrationReport", "StoreInUseError", "migrate", "KILL_AFTER_ENV"]

log = logging.getLogger(__name__)

# test-only: SIGKILL this process right after its N-th change, so crash tests can stop it at every step
KILL_AFTER_ENV = "SUBAGENTS_MIGRATE_KILL_AFTER"
_DROPPED = ("header", "log", "lease", ".lock", ".lock.queue")  # what a v1 trash entry loses once converted
_TRASHED_FILE = "session"  # a session's file in a v2 trash entry (store/retention.py)
# the ``migrating`` values of a conversion of version-1 folders under way: 2 or 3 when a build of
# version 2 or 3 started it (its steps are this build's), 4 when this one did
_LAYOUT_CONVERSIONS = (2, 3, STORE_VERSION)
# the versions whose files this build reads as they are: only the marker (and the index lock files) change
_MARKER_ONLY = (2, 3)


class StoreInUseError(SubagentError):
    """A supervisor, or another migration, uses the store: converting it now would pull its files away."""

    code = "STORE_IN_USE"


@dataclass(frozen=True)
class MigrationReport:
    root: str
    from_version: int  # 1 (folders converted), 2 or 3 (lock files and marker), or 4 when the store was already converted (nothing done)
    converted: int  # sessions this run converted
    already: int  # sessions found converted (an earlier, interrupted run)
    debris: int  # folders without a header (crashed creations) removed
    trash: int  # version-1 trash entries converted
    leases_rebuilt: int  # damaged leases replaced by a released one at the log's highest epoch
    resumed: bool  # this run finished an interrupted one
    steps: int  # changes made to the store
    to_version: int = STORE_VERSION  # the version the store is now
    index_locks_removed: int = 0  # the lock files versions 1 to 3 kept beside each index, removed by this run

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _read_marker(root: str) -> dict[str, Any]:
    if not os.path.isdir(root) or not marker_present(root):
        raise missing_marker(root)
    info = read_marker(root)
    if not isinstance(info, dict) or info.get("format") != STORE_FORMAT:
        raise StoreFormatError(f"{root} holds format {info!r}, not a {STORE_FORMAT}", path=root)
    if info.get("migrating") not in (None, *_LAYOUT_CONVERSIONS) or (
            info.get("migrating") is None and info.get("version") not in (1, *_MARKER_ONLY, STORE_VERSION)):
        raise StoreFormatError(f"{root} is a {STORE_FORMAT} of version {info.get('version')!r}: this build converts versions 1 to 3 "
                               f"to {STORE_VERSION}", path=root)
    return info


@contextlib.contextmanager
def _exclusive(root: str) -> Iterator[None]:
    """One migration at a time: an ``flock`` on the root folder itself (nothing else locks it)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreInUseError(f"another `subagents store migrate` is converting {root}", path=root) from None
        yield
    finally:
        os.close(fd)


def _refuse_live_owners(root: str) -> None:
    """``STORE_IN_USE`` while any supervisor may still run: by heartbeat, or its process on this host."""
    host = host_identity()
    folder = os.path.join(root, "owners")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        record = read_owner_file(os.path.join(folder, name))
        running = (record is not None and record.host == host and record.pid_start is not None
                   and process_start_time(record.pid) == record.pid_start)
        if owner_alive(record, host=host) or running:
            raise StoreInUseError(f"supervisor {name} (pid {record.pid if record else '?'}) uses {root}: stop it first, "
                                  "then run `subagents store migrate` again", path=root, owner=name)


def migrate(root: str | os.PathLike[str], *, durability: str | Durability = "batched") -> MigrationReport:
    """Convert the store at ``root`` to format version 4 (a no-op report when it already is)."""
    root = os.path.abspath(os.fspath(root))
    policy = durability if isinstance(durability, Durability) else durability_policy(durability)
    _read_marker(root)  # not a store: refused before the lock
    # nor one missing a folder (every version has the same four): a conversion would die on the gone
    # ``sessions/``, or leave a store that every verb refuses, and "nothing to convert" would hide the loss
    damaged = layout_damage(root)
    if damaged is not None:
        raise damaged
    with _exclusive(root):
        info = _read_marker(root)
        if info.get("version") == STORE_VERSION and info.get("migrating") is None:
            return MigrationReport(root, STORE_VERSION, 0, len(_published(root)), 0, 0, 0, False, 0)
        _refuse_live_owners(root)
        for folder in (root, os.path.join(root, "sessions")):
            if not os.access(folder, os.W_OK | os.X_OK):
                raise ReadOnlyStoreError(f"cannot convert the store at {root}: {folder} is not writable", path=root)
        if info.get("version") in _MARKER_ONLY and info.get("migrating") is None:
            return _marker_only(root, info, policy)
        return _Migration(root, info, policy).run()


def _final_marker(info: dict[str, Any]) -> dict[str, Any]:
    limit = info.get("max_record_bytes")
    return {"format": STORE_FORMAT, "version": STORE_VERSION, **({} if limit is None else {"max_record_bytes": limit})}


def _marker_only(root: str, info: dict[str, Any], policy: Durability) -> MigrationReport:
    """Version 2 or 3 to 4: the index lock files go, then one atomic replace of the marker
    (every version-2 or -3 file is a version-4 file).

    The owners are checked again after it, as the layout conversion does: a
    supervisor of an older version that opened the store meanwhile gets its marker
    back (``STORE_IN_USE``); one that opens it from now on is refused by the new marker.
    """
    steps = Steps(KILL_AFTER_ENV)
    removed = _remove_index_locks(root, steps, sync=policy.syncs_at_commit)
    marker = os.path.join(root, "STORE")
    write_atomic(marker, msgpack.packb(_final_marker(info)), durable=policy.syncs_at_commit)
    steps.done()
    try:
        _refuse_live_owners(root)
    except StoreInUseError:
        write_atomic(marker, msgpack.packb(info), durable=policy.syncs_at_commit)
        raise
    version = info["version"]
    log.info("converted %s from format version %d to %d (%d index lock files removed)", root, version, STORE_VERSION, removed)
    return MigrationReport(root, version, 0, len(_published(root)), 0, 0, 0, False, steps.count, index_locks_removed=removed)


def _remove_index_locks(root: str, steps: Steps, *, sync: bool) -> int:
    """Remove the lock files versions 1 to 3 kept beside each index (``<name>.lock``, and the
    ``<name>.lock.queue`` of early version-1 builds); idempotent; how many it removed. Nothing
    else in ``index/`` has a name ending so."""
    count = 0
    for folder in (os.path.join(root, "index"), os.path.join(root, "index", "children")):
        try:
            names = sorted(os.listdir(folder))
        except FileNotFoundError:
            continue
        before = count
        for name in names:
            if name.endswith((".lock", ".lock.queue")):
                path = os.path.join(folder, name)
                if os.path.isfile(path) and not os.path.islink(path):
                    os.unlink(path)
                    count += 1
                    steps.done()
        if count > before and sync:
            fsync_dir(folder)
    return count


def _published(root: str) -> list[str]:
    with os.scandir(os.path.join(root, "sessions")) as entries:
        return [e.name for e in entries if "." not in e.name and e.is_file(follow_symlinks=False)]


class _Migration:
    def __init__(self, root: str, info: dict[str, Any], policy: Durability) -> None:
        self.root = root
        self.info = info
        self.sync = policy.syncs_at_commit
        self.sessions = os.path.join(root, "sessions")
        self.trash_dir = os.path.join(root, "trash")
        self.steps = Steps(KILL_AFTER_ENV)
        self.converted = self.already = self.debris = self.trash = self.rebuilt = 0
        self.aside: list[str] = []  # v1 folders whose session is converted: removed after the fsync of sessions/

    def run(self) -> MigrationReport:
        resumed = self.info.get("migrating") is not None
        final = _final_marker(self.info)
        if not resumed:
            # version 4 already: a build of version 1 to 3 refuses it too, while this run is under way
            self._marker({**final, "migrating": STORE_VERSION})
            try:
                _refuse_live_owners(self.root)  # a supervisor of version 1 that opened the store meanwhile
            except StoreInUseError:
                write_atomic(os.path.join(self.root, "STORE"), msgpack.packb(self.info), durable=self.sync)
                raise
        log.info("%s the conversion of %s to format version %d", "finishing" if resumed else "starting", self.root, STORE_VERSION)
        names = set(os.listdir(self.sessions))
        for name in sorted(names):
            self._entry(name, names)
        if self.sync:
            fsync_dir(self.sessions)  # every converted file under its name before any v1 folder goes
        for aside in self.aside:
            self._remove(aside)
        if os.path.isdir(self.trash_dir):
            for name in sorted(os.listdir(self.trash_dir)):
                folder = os.path.join(self.trash_dir, name)
                if not name.startswith(".") and os.path.isdir(folder) and not os.path.islink(folder):
                    self._trash_entry(folder)
        if self.sync and os.path.isdir(self.trash_dir):
            fsync_dir(self.trash_dir)
        removed = _remove_index_locks(self.root, self.steps, sync=self.sync)
        self._marker(final)
        return MigrationReport(self.root, 1, self.converted, self.already, self.debris, self.trash, self.rebuilt, resumed,
                               self.steps.count, index_locks_removed=removed)

    def _marker(self, info: dict[str, Any]) -> None:
        write_atomic(os.path.join(self.root, "STORE"), msgpack.packb(info), durable=self.sync)
        self.steps.done()

    def _entry(self, name: str, names: set[str]) -> None:
        """One name in ``sessions/``: a v1 folder, a folder set aside, a stray temporary file, or a v2 file."""
        path = os.path.join(self.sessions, name)
        if os.path.islink(path):
            return  # never followed; a link in a session's place stays what it was: unavailable
        if is_valid_session_id(name):
            if os.path.isdir(path):
                self._convert(name, path)
            elif os.path.isfile(path) and f".{name}.v1" not in names:
                self.already += 1
            return
        session_id, dot, kind = name[1:].rpartition(".")
        if not name.startswith(".") or not dot or not is_valid_session_id(session_id):
            return
        if kind == "v1" and os.path.isdir(path):
            target = os.path.join(self.sessions, session_id)
            if os.path.isfile(target) and not os.path.islink(target):
                self._finish(session_id, path)  # converted; the folder's rest is left
                self.already += 1
            elif not os.path.lexists(target):
                self._convert(session_id, path)  # set aside before its file was renamed in
        elif kind == "v2" and not os.path.isdir(os.path.join(self.sessions, session_id)) and f".{session_id}.v1" not in names:
            os.unlink(path)  # nothing converts from a source any more: a leftover
            self.steps.done()

    def _convert(self, session_id: str, source: str) -> None:
        if not os.path.exists(os.path.join(source, "header")):
            self._remove(source)  # a creation that crashed before publishing: no session
            self.debris += 1
            return
        blob = self._v2_bytes(session_id, source)
        temp = os.path.join(self.sessions, f".{session_id}.v2")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        write_new(temp, blob, durable=self.sync)
        self.steps.done()
        aside = os.path.join(self.sessions, f".{session_id}.v1")
        if source != aside:
            os.rename(source, aside)
            self.steps.done()
        os.rename(temp, os.path.join(self.sessions, session_id))
        self.steps.done()
        self._finish(session_id, aside)
        self.converted += 1

    def _remove(self, folder: str) -> None:
        """Delete a folder of ``sessions/``, durably before its inode can be reused, as one step: a
        power loss must not leave ``sessions/<id>`` (a crashed creation) or ``.<id>.v1`` naming a
        stranger's file, which the next run would take for a converted session or a folder to empty."""
        remove_durably([folder], durable=self.sync)
        self.steps.done()

    def _finish(self, session_id: str, aside: str) -> None:
        """Move the companions out of the folder set aside; it is removed at the end of the run."""
        for name in COMPANIONS:
            try:
                os.rename(os.path.join(aside, name), os.path.join(self.sessions, f"{session_id}.{name}"))
            except FileNotFoundError:
                continue
            self.steps.done()
        self.aside.append(aside)

    def _trash_entry(self, folder: str) -> None:
        """A v1 entry gets its ``session`` file, then loses its header (the mark of a v1 entry) and the rest."""
        if os.path.exists(os.path.join(folder, "header")):
            session_id = os.path.basename(folder).partition(".")[0]
            temp = os.path.join(folder, f".{_TRASHED_FILE}.v2")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            write_new(temp, self._v2_bytes(session_id, folder), durable=self.sync)
            os.rename(temp, os.path.join(folder, _TRASHED_FILE))
            if self.sync:
                fsync_dir(folder)  # the new file under its name before the header goes
            self.steps.done()
            self.trash += 1
        # durably, as in ``_remove``: a ``header`` that came back naming a stranger's file would be converted again
        for _ in range(remove_durably([os.path.join(folder, name) for name in _DROPPED], durable=self.sync)):
            self.steps.done()

    def _v2_bytes(self, session_id: str, folder: str) -> bytes:
        """The v2 file of the v1 session in ``folder``: its header and log bytes as they are, its lease in slot 0."""
        try:
            header = read_bytes(os.path.join(folder, "header"))
            log_bytes = _optional(os.path.join(folder, "log"))
            raw_lease = _optional(os.path.join(folder, "lease"))
        except OSError as exc:
            raise StoreFormatError(f"cannot convert session {session_id}: a file of {folder} cannot be read "
                                   f"({exc.strerror or exc}); fix or remove it, then run `subagents store migrate` again",
                                   path=self.root) from None
        lease: Lease | None = None
        if raw_lease:
            found = decode_lease(raw_lease)
            if isinstance(found, str):
                # every version-1 writer is locked out by the new layout; released at the log's highest
                # epoch, the next acquisition still goes past every epoch the log shows
                epochs = [e.get("epoch", 0) for e in scan(log_bytes).records]
                found = Lease("migrate", max([1, *(e for e in epochs if isinstance(e, int))]), "released", 0.0)
                log.warning("session %s: its lease does not decode; converted as released at epoch %d", session_id, found.epoch)
                self.rebuilt += 1
            lease = found
        return encode_session(header, lease, log_bytes)


def _optional(path: str) -> bytes:
    try:
        return read_bytes(path)
    except FileNotFoundError:
        return b""
