"""Owners and leases: who may write a session, fenced by an epoch.

An **owner** is one supervisor instance. It writes ``owners/<owner-id>``
(host, boot id, pid, the pid's start time, heartbeat time, TTL) and renews
that ONE file for all of its leases, so renewal cost does not grow with the
number of children.

A **lease** (two slots in the session's file, ``store/session_file.py``) names the owner holding a session's
activation, its state (``running`` / ``idle`` / ``released``) and an
**epoch**. Acquiring takes the session lock and succeeds when there is no
lease, it is released, it is already ours, or its owner is dead; it writes
``epoch + 1`` (``+ 2`` past a slot that does not decode, which may hide one
acquisition). Every append compares the writer's epoch to the lease's under
the same lock (``store/log.py``), so a writer that was taken over can never
write again.

An owner is dead when (a) on the same host (same boot id) its pid no longer
runs the process that registered — pid reuse is caught by the start time —
or (b) its heartbeat is older than its TTL. (b) also catches a live but
stopped (SIGSTOP) or hung owner. What is *not* guaranteed: clocks across
hosts are trusted to within a fraction of the TTL (heartbeat ages are wall
clock), and ``flock`` does not exclude across NFS: one host, local disk.

A damaged lease (neither slot decodes) is never guessed at: readers see it
as no proof of a live holder
(``read_lease`` → ``None``, status ``complete``; the catalog lists the
session as a diagnostic through ``check_lease``), a writer's fence check
fails, and ``acquire_lease`` refuses (``CorruptSessionError``) rather than
restart the epoch below one a fenced writer may still hold.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import msgpack

from .atomic import NOFOLLOW, write_atomic
from .errors import CorruptSessionError, DurabilityError, FencedError, LeaseHeldError, SessionNotFoundError, SubagentError, UnavailableSessionError
from .locks import pin_flock
from .header import SessionHeader
from .ids import new_id
from .index_writers import IndexWriters
from .lease_record import Lease, LeaseState
from .reader import open_session, scan_events
from .session_file import LeaseSlots, SessionFile
from .projection import Projection
from .records import OwnerFields, unpack, validate
from .root import Store
from .rows import note_active, note_settled

__all__ = [
    "LeaseState",
    "Lease",
    "OwnerRecord",
    "host_identity",
    "process_start_time",
    "register_owner",
    "maintenance_owner",
    "heartbeat",
    "remove_owner",
    "read_owner",
    "owner_record_unreadable",
    "owner_alive",
    "owner_gone",
    "read_lease",
    "taken_over",
    "check_lease",
    "lease_of",
    "acquire_lease",
    "set_lease_state",
    "release_lease",
    "write_released",
    "session_status",
    "OwnerCache",
]



def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def host_identity() -> str:
    """Host name plus boot id: a rebooted host is another host for pid checks."""
    return f"{socket.gethostname()}/{_boot_id()}"


def process_start_time(pid: int) -> int | None:
    """The pid's start time in clock ticks since boot (``/proc``), ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    # the command name may hold spaces and parentheses: split after the last ')'
    fields = raw[raw.rfind(b")") + 2 :].split()
    if fields and fields[0] in (b"Z", b"X"):
        return None  # a zombie (or a process being reaped) runs nothing
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


# the owner record's "renewal": its heartbeats set the file's modification time (``heartbeat``)
RENEWED_BY_MTIME = "mtime"
# the owner record's "role" when it is a maintenance pass, not a host (absent for a host)
MAINTENANCE_ROLE = "maintenance"
# more than any owner record takes (ids of 64 characters, a host name and boot id, six numbers)
_OWNER_BYTES = 4096


@dataclass(frozen=True)
class OwnerRecord:
    owner_id: str
    host: str
    pid: int
    pid_start: int | None
    started_at: float
    heartbeat_at: float
    ttl: float
    # a maintenance pass (``store fsck --repair``) that holds leases for a moment and runs no turn: a
    # message sent to a child it holds waits it out, as no watcher of its would run that message
    maintenance: bool = False

    def to_record(self) -> dict[str, Any]:
        record = {
            "owner": self.owner_id,
            "host": self.host,
            "pid": self.pid,
            "pid_start": self.pid_start,
            "started_at": self.started_at,
            "heartbeat_at": self.heartbeat_at,
            "ttl": self.ttl,
            "renewal": RENEWED_BY_MTIME,
        }
        if self.maintenance:
            record["role"] = MAINTENANCE_ROLE
        return record


# -- owners -------------------------------------------------------------------


def register_owner(store: Store, owner_id: str, *, ttl: float, maintenance: bool = False) -> OwnerRecord:
    pid = os.getpid()
    now_ns = time.time_ns()
    now = now_ns / 1e9
    record = OwnerRecord(owner_id, host_identity(), pid, process_start_time(pid), now, now, float(ttl), maintenance)
    _write_owner(store, store.owner_path(owner_id), record, now_ns)
    return record


@contextmanager
def maintenance_owner(store: Store, *, ttl: float) -> Iterator[str]:
    """A new owner for a maintenance pass (its id), registered as one and removed at the end.

    Its leases are held for a repair, never for a turn: delivery waits until it lets go
    rather than leave a message for it to run (``OwnerRecord.maintenance``). It keeps no
    heartbeat, so a pass longer than ``ttl`` reads as dead and loses what it holds."""
    owner_id = new_id()
    register_owner(store, owner_id, ttl=ttl, maintenance=True)
    try:
        yield owner_id
    finally:
        remove_owner(store, owner_id)


def _write_owner(store: Store, path: str, record: OwnerRecord, beat_ns: int) -> None:
    """Write the owner file whole, its time set to ``beat_ns`` (the record's ``heartbeat_at``).

    Readers take the later of the record's time and the file's; a new file's time is the clock's
    coarse tick at the write, which can follow ``beat_ns`` (a tick between the two), and the
    writer's record would then not be the one its readers read.

    Durable as the store's commits are: the leases that name the owner are, and a record lost to a
    power loss while its lease survived read empty, an owner that "may still run", whose lease no
    ``fsck --repair`` or ``gc`` would then ever free. Once per supervisor: heartbeats set the time."""
    write_atomic(path, msgpack.packb(record.to_record()), durable=store.durability.syncs_at_commit)
    os.utime(path, ns=(beat_ns, beat_ns), follow_symlinks=False)


def heartbeat(store: Store, record: OwnerRecord) -> OwnerRecord:
    """Renew the owner's single heartbeat file (covers all of its leases).

    The renewal is the file's modification time, set with ``utime``: no new
    file, so a supervisor's heartbeat allocates and frees no inode (a rename
    of a fresh copy every TTL/3 did). Readers take the later of the record's
    ``heartbeat_at`` and the file's mtime (FORMAT.md §7). A file that is gone
    (removed by hand) is written again whole.
    """
    now_ns = time.time_ns()
    fresh = OwnerRecord(**{**record.__dict__, "heartbeat_at": now_ns / 1e9})  # as a reader gets it from the mtime
    path = store.owner_path(record.owner_id)
    try:
        os.utime(path, ns=(now_ns, now_ns), follow_symlinks=False)
    except FileNotFoundError:
        _write_owner(store, path, fresh, now_ns)
    return fresh


def remove_owner(store: Store, owner_id: str) -> None:
    try:
        os.unlink(store.owner_path(owner_id))
    except FileNotFoundError:
        pass


def read_owner(store: Store, owner_id: str) -> OwnerRecord | None:
    """The owner's record; ``None`` when absent, unreadable or damaged (an owner that proves nothing is dead)."""
    try:
        path = store.owner_path(owner_id)
    except ValueError:  # an owner id that is not an id
        return None
    return read_owner_file(path)


def owner_record_unreadable(store: Store, owner_id: str) -> bool:
    """Whether ``owners/<owner_id>`` is there though ``read_owner`` found no record in it (empty, garbage,
    a folder): it proves neither a live owner nor a dead one, so nothing that cannot be undone (a gc,
    fsck's release) may take it for gone. Asked after ``read_owner`` gave ``None``; an owner that is no
    id names no file."""
    try:
        path = store.owner_path(owner_id)
    except ValueError:
        return False
    return os.path.lexists(path)


def read_owner_file(path: str) -> OwnerRecord | None:
    """``read_owner`` by path: for ``store/migrate.py``, which reads the owners of a store no ``Store`` opens."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
    except OSError:
        return None
    try:
        renewed = os.fstat(fd).st_mtime_ns / 1e9  # the heartbeat (``heartbeat``): before the read, never later than it
        raw = os.read(fd, _OWNER_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        value = unpack(raw)
    except ValueError:
        return None
    data = validate(OwnerFields, value)
    if isinstance(data, str):
        return None
    # only a record that says so is renewed through its file's time: an owner file written by a
    # build that replaced it whole (or copied without its times) would otherwise read as fresh
    beat = max(data.heartbeat_at, renewed) if value.get("renewal") == RENEWED_BY_MTIME else data.heartbeat_at
    return OwnerRecord(data.owner, data.host, data.pid, data.pid_start, data.started_at, beat, data.ttl,
                       value.get("role") == MAINTENANCE_ROLE)



def owner_alive(record: OwnerRecord | None, *, now: float | None = None, host: str | None = None) -> bool:
    if record is None:
        return False
    now = time.time() if now is None else now
    if now - record.heartbeat_at > record.ttl:
        return False
    if record.host == (host or host_identity()):
        start = process_start_time(record.pid)
        if start is None or (record.pid_start is not None and start != record.pid_start):
            return False
    return True


def owner_gone(record: OwnerRecord, *, host: str | None = None) -> bool:
    """Whether the owner's process can never run again: not merely late, but gone for good.

    On this host (same name and boot id): its pid runs no more, is a zombie,
    or runs another process (the start time differs). On a host of the same
    name with another boot id: the host rebooted since. An owner of another
    host is never known to be gone (it may be stopped, or its clock behind),
    nor is one whose pid runs while its start time is unknown.
    """
    here = host or host_identity()
    if record.host == here:
        start = process_start_time(record.pid)
        return start is None or (record.pid_start is not None and start != record.pid_start)
    name, _, boot = record.host.rpartition("/")
    here_name, _, here_boot = here.rpartition("/")
    return name == here_name and bool(boot) and bool(here_boot) and boot != here_boot


class OwnerCache:
    """Owner liveness memoized for one query (a listing reads each owner once)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._host = host_identity()
        self._now = time.time()
        self._alive: dict[str, bool] = {}

    def alive(self, owner_id: str) -> bool:
        if owner_id not in self._alive:
            self._alive[owner_id] = owner_alive(read_owner(self._store, owner_id), now=self._now, host=self._host)
        return self._alive[owner_id]

    def holds(self, lease: Lease | None) -> bool:
        """Whether ``lease`` is held by a live owner: taken, not released, its owner alive."""
        return lease is not None and lease.state != "released" and self.alive(lease.owner)


# -- leases -------------------------------------------------------------------


def check_lease(store: Store, session_id: str) -> Lease | None:
    """The session's lease, ``None`` when it was never leased; ``CorruptSessionError`` when its
    slots do not decode (or the session file does not), ``UnavailableSessionError`` when it
    cannot be read, ``SessionNotFoundError`` without a session."""
    with open_session(store, session_id) as file:
        return lease_of(file)


def taken_over(store: Store, owner_id: str, session_ids: Iterable[str]) -> list[str]:
    """Which of ``session_ids``, leased by ``owner_id``, another owner's lease holds now: once that
    owner's heartbeat lapsed (a stopped or stalled process), the sessions whose turns it must stop.
    Its owner alone says so (a higher epoch of ``owner_id``'s own is its own re-acquisition); a lease
    that does not read is not counted, since the holder's next write decides, as always."""
    lost = []
    for session_id in session_ids:
        try:
            lease = check_lease(store, session_id)
        except (SubagentError, OSError):
            continue
        if lease is not None and lease.owner != owner_id:
            lost.append(session_id)
    return lost


def lease_of(file: SessionFile) -> Lease | None:
    """``check_lease`` of a session file its caller has open."""
    return _slots(file).lease


def _slots(file: SessionFile) -> LeaseSlots:
    try:
        slots = file.read_slots()
    except OSError as exc:
        raise UnavailableSessionError.of(file.session_id, "its lease cannot be read", exc) from None
    if slots.problem is not None:
        raise CorruptSessionError(file.session_id, slots.problem)
    return slots


def read_lease(store: Store, session_id: str) -> Lease | None:
    """The lease, or ``None`` when there is none, no session *or it is damaged* (it then proves
    no holder); never raises for damage. ``check_lease`` tells these apart."""
    try:
        return check_lease(store, session_id)
    except (CorruptSessionError, UnavailableSessionError, SessionNotFoundError):
        return None


def _write_lease(store: Store, file: SessionFile, slots: LeaseSlots, lease: Lease, *, durable: bool) -> None:
    """Write ``lease`` in place (``slots`` read under the lock we hold); fsync'd for an acquisition."""
    try:
        file.write_lease(slots, lease, synced=durable)
        if durable and store.durability.syncs_at_commit:
            os.fsync(file.fd)
    except OSError as exc:
        raise DurabilityError(f'writing the lease of session "{file.session_id}" failed: {exc}', session_id=file.session_id) from exc


def acquire_lease(store: Store, session_id: str, owner_id: str, *, state: LeaseState = "running", take_own: bool = True) -> Lease:
    """Take the session's lease at ``epoch + 1``; ``LeaseHeldError`` if a live other owner holds it.

    ``take_own=False``: ``LeaseHeldError`` too when ``owner_id`` itself holds it (not released), for a caller
    that must not fence a writer of its own process (a drain of a child it saw nobody host, and a resume of it)."""
    with open_session(store, session_id, write=True) as file:
        # the lock gc takes too (store/retention.py): whoever holds it first wins. A session gc
        # moved to the trash while we waited is gone (SessionNotFoundError), never written.
        try:
            pin_flock(file.fd, file.path)
        except FileNotFoundError:
            raise SessionNotFoundError(session_id) from None
        try:
            slots = _slots(file)  # damage: refuse, never restart the epoch
            if slots.gen < 0:
                _require_never_leased(file)
            current = slots.lease
            if current is not None and current.state != "released" and (
                    not take_own if current.owner == owner_id else owner_alive(read_owner(store, current.owner))):
                raise LeaseHeldError(session_id, owner=current.owner, epoch=current.epoch)
            if current is not None:
                # the child may have a ``settled`` row (written at a release): from here it no longer holds
                note_active(store, session_id)
            # past the epoch a slot that does not decode may hide (``LeaseSlots.undecodable_beside``)
            step = 2 if slots.undecodable_beside else 1
            lease = Lease(owner_id, (current.epoch if current else 0) + step, state, time.time())
            # durable: an epoch must never go backwards after a crash, or two writers could share one
            _write_lease(store, file, slots, lease, durable=True)
            return lease
        finally:
            file.unlock()


def _require_never_leased(file: SessionFile) -> None:
    """Two empty slots read as "never leased" (a file written without its creation record); a log
    written under a lease says they were emptied behind the store's back. Taking epoch 1 then would
    restart the epoch under a writer fenced long ago: ``CorruptSessionError``, as for slots that do
    not decode. Read only on this rare path (every session is created with a record in slot 0)."""
    data, beyond = file.read_records()
    events = scan_events(data, beyond=beyond).records
    written = max((e["epoch"] for e in events if isinstance(e.get("epoch"), int)), default=0)
    if written > 0:
        raise CorruptSessionError(file.session_id, f"both lease slots are empty, but its log was written at epoch {written}: "
                                  "the lease was lost, and restarting its epoch could let a fenced writer write again")


def _fenced_update(store: Store, session_id: str, owner_id: str, epoch: int, state: LeaseState) -> Lease:
    # a plain blocking flock: the holder of the lease updates its own record, a short critical
    # section where polling buys nothing
    with open_session(store, session_id, write=True) as file:
        file.lock()
        try:
            if not file.still_linked():  # collected by gc while we waited: nothing to update
                raise SessionNotFoundError(session_id)
            return _update_locked(store, file, owner_id, epoch, state)
        finally:
            file.unlock()


def _update_locked(store: Store, file: SessionFile, owner_id: str, epoch: int, state: LeaseState) -> Lease:
    try:
        slots = _slots(file)
    except CorruptSessionError:
        slots = None
    current = None if slots is None else slots.lease
    if slots is None or current is None or current.epoch != epoch or current.owner != owner_id:
        raise FencedError(file.session_id, epoch=epoch, current_epoch=None if current is None else current.epoch)
    lease = Lease(owner_id, epoch, state, current.acquired_at)
    if current.state != state:
        # not durable: a lost state change reads as the owner's (dead) lease, i.e. complete
        _write_lease(store, file, slots, lease, durable=False)
        if state == "released":
            # the catalog row, still under the lock: after the release (a row that could not be
            # written then leaves the child listed from its files, never a settled row beside a held
            # lease; and the release is the file's last write, whose time the row records),
            # before anyone may take the lease again (their ``active`` row comes after it)
            note_settled(store, file)
    return lease


def set_lease_state(store: Store, session_id: str, owner_id: str, epoch: int, state: Literal["running", "idle"]) -> Lease:
    """Record ``running`` / ``idle``; ``FencedError`` if the lease moved on."""
    return _fenced_update(store, session_id, owner_id, epoch, state)


def release_lease(store: Store, session_id: str, owner_id: str, epoch: int) -> None:
    """Mark the lease released (the epoch stays, so the next acquisition is higher)."""
    _fenced_update(store, session_id, owner_id, epoch, "released")


def write_released(
    store: Store, file: SessionFile, slots: LeaseSlots, *, header: SessionHeader | None = None, projection: Projection | None = None,
    writers: IndexWriters | None = None,
) -> None:
    """Write the release of ``slots.lease`` (read under the session lock the caller holds).

    For a log writer that has just checked that lease against its epoch under
    that lock (``LogWriter.release_lease``). The catalog's ``settled`` row
    follows under the same lock, as in ``release_lease`` (``store/rows.py``),
    from the writer's ``header`` and ``projection`` when it gives them, through
    ``writers`` when given (the parent's index kept open); the row records the
    file's time after the release's write, its last. Not durable, as
    every state change: a release lost in a crash reads as the dead owner's lease.
    """
    current = slots.lease
    if current is None or current.state == "released":
        return
    _write_lease(store, file, slots, Lease(current.owner, current.epoch, "released", current.acquired_at), durable=False)
    note_settled(store, file, header=header, projection=projection, writers=writers)


def session_status(store: Store, session_id: str, owners: OwnerCache | None = None) -> Literal["running", "idle", "complete"]:
    """``running`` / ``idle`` from a live owner's lease, else ``complete``."""
    lease = read_lease(store, session_id)
    if lease is None or not (owners or OwnerCache(store)).holds(lease):
        return "complete"
    return "idle" if lease.state == "idle" else "running"
