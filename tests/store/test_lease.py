"""Owners and leases: acquisition, epochs, liveness (pid and heartbeat), fenced updates, status."""

from __future__ import annotations

import os
import signal
import time

import pytest

from subagents import store
from subagents.store.lease import host_identity, process_start_time

from ..session_bytes import lease_slots, slot_records, synced_slot
from ._support import Child, wait_until, write_file


@pytest.fixture
def s1(st):
    store.create_session(st, "s1")
    return st


def test_acquire_release_reacquire(s1):
    """Epochs start at 1, survive a release, and every acquisition adds one."""
    st = s1
    store.register_owner(st, "o1", ttl=60)
    assert store.read_lease(st, "s1") is None
    lease = store.acquire_lease(st, "s1", "o1")
    assert (lease.owner, lease.epoch, lease.state) == ("o1", 1, "running")
    assert store.read_lease(st, "s1") == lease
    assert lease_slots(st, "s1") == lease  # on disk, as the slots decode
    # the creation wrote gen 0 (never leased, slot 0), so the first acquisition is gen 1 in slot 1
    assert synced_slot(st, "s1") == 1
    assert slot_records(st, "s1")[1] == {"gen": 1, **lease.to_record(), "synced": True}
    store.release_lease(st, "s1", "o1", 1)
    released = store.read_lease(st, "s1")
    assert (released.state, released.epoch) == ("released", 1)
    again = store.acquire_lease(st, "s1", "o2", state="idle")  # o2 never registered: fine, the lease was released
    assert (again.owner, again.epoch, again.state) == ("o2", 2, "idle")
    assert store.acquire_lease(st, "s1", "o2").epoch == 3  # the holder itself may re-acquire: a new epoch


def test_an_owner_that_must_not_fence_itself_is_refused_its_own_lease(s1):
    """``take_own=False`` (a drain of a child it saw nobody host): the owner's own unreleased lease is held,
    not taken again at ``epoch + 1``, which fenced that owner's live writer; a released one is taken."""
    st = s1
    store.register_owner(st, "o1", ttl=60)
    held = store.acquire_lease(st, "s1", "o1")
    with pytest.raises(store.LeaseHeldError):
        store.acquire_lease(st, "s1", "o1", state="idle", take_own=False)
    assert store.read_lease(st, "s1") == held  # untouched: the writer at its epoch is not fenced
    store.release_lease(st, "s1", "o1", held.epoch)
    taken = store.acquire_lease(st, "s1", "o1", state="idle", take_own=False)
    assert (taken.owner, taken.epoch, taken.state) == ("o1", held.epoch + 1, "idle")


def test_live_owner_holds_the_lease(s1):
    """Another owner's acquisition fails with LeaseHeldError while the holder is alive."""
    st = s1
    store.register_owner(st, "o1", ttl=60)
    store.acquire_lease(st, "s1", "o1")
    with pytest.raises(store.LeaseHeldError) as info:
        store.acquire_lease(st, "s1", "o2")
    assert (info.value.owner, info.value.epoch, info.value.code) == ("o1", 1, "LEASE_HELD")
    assert store.read_lease(st, "s1").owner == "o1"


def test_unregistered_or_removed_owner_is_dead(s1):
    """A lease whose owner has no (readable) owner file can be taken over."""
    st = s1
    store.register_owner(st, "o1", ttl=60)
    store.acquire_lease(st, "s1", "o1")
    store.remove_owner(st, "o1")
    store.remove_owner(st, "o1")  # idempotent
    assert store.acquire_lease(st, "s1", "o2").epoch == 2
    write_file(st.owner_path("o2"), b"\xc1garbage")
    assert store.read_owner(st, "o2") is None
    assert store.acquire_lease(st, "s1", "o3").epoch == 3


def test_takeover_after_heartbeat_expiry(s1):
    """A live process whose heartbeat is older than its TTL has lost its leases; a heartbeat revives it."""
    st = s1
    record = store.register_owner(st, "o1", ttl=0.05)
    store.acquire_lease(st, "s1", "o1")
    # alive while its heartbeat is younger than the TTL: judged at a moment inside it, since the
    # 50 ms may already be gone on a loaded machine (a durable lease write alone can take longer)
    assert store.owner_alive(record, now=record.heartbeat_at + record.ttl / 2)
    wait_until(lambda: not store.owner_alive(store.read_owner(st, "o1")), what="heartbeat expiry")
    fresh = store.heartbeat(st, record)
    assert fresh.heartbeat_at > record.heartbeat_at and fresh.started_at == record.started_at
    assert store.read_owner(st, "o1") == fresh
    assert store.owner_alive(store.read_owner(st, "o1"), now=fresh.heartbeat_at + fresh.ttl / 2)  # revived
    wait_until(lambda: not store.owner_alive(store.read_owner(st, "o1")), what="heartbeat expiry")
    assert store.acquire_lease(st, "s1", "o2").epoch == 2


def test_owner_alive_rules():
    """Alive: fresh heartbeat and, on this host, the same process still running."""
    me = os.getpid()
    now = time.time()
    here = host_identity()
    mine = store.OwnerRecord("o", here, me, process_start_time(me), now, now, 10.0)
    assert store.owner_alive(mine)
    assert not store.owner_alive(mine, now=now + 11)
    assert not store.owner_alive(None)
    reused = store.OwnerRecord("o", here, me, (process_start_time(me) or 0) + 1, now, now, 10.0)
    assert not store.owner_alive(reused)  # a recycled pid runs another process
    elsewhere = store.OwnerRecord("o", "other-host/boot", 999_999_999, None, now, now, 10.0)
    assert store.owner_alive(elsewhere)  # another host: only the heartbeat counts
    assert not store.owner_alive(elsewhere, now=now + 11)
    gone = store.OwnerRecord("o", here, 999_999_999, None, now, now, 10.0)
    assert not store.owner_alive(gone)


def test_takeover_after_kill_9_without_waiting_for_ttl(s1):
    """A holder killed with SIGKILL on this host is dead at once, though its heartbeat is fresh for an hour."""
    st = s1
    with Child("hold-lease", st.root, "s1", "holder", "3600") as child:
        assert child.expect("ACQUIRED ") == ["1"]
        record = store.read_owner(st, "holder")
        assert record.pid == child.pid and record.ttl == 3600
        with pytest.raises(store.LeaseHeldError):
            store.acquire_lease(st, "s1", "taker")
        assert store.session_status(st, "s1") == "running"
        os.kill(child.pid, signal.SIGKILL)
        child.proc.wait(timeout=20)
    assert time.time() - record.heartbeat_at < record.ttl
    assert store.session_status(st, "s1") == "complete"
    lease = store.acquire_lease(st, "s1", "taker")
    assert (lease.owner, lease.epoch) == ("taker", 2)


def test_killed_but_unreaped_holder_is_dead(s1):
    """A zombie (killed, not yet reaped) runs nothing: its lease can be taken over."""
    st = s1
    with Child("hold-lease", st.root, "s1", "holder", "3600") as child:
        child.expect("ACQUIRED ")
        os.kill(child.pid, signal.SIGKILL)
        wait_until(lambda: process_start_time(child.pid) is None, what="the zombie state")
        assert child.proc.poll() is None or child.proc.returncode == -signal.SIGKILL
        assert store.acquire_lease(st, "s1", "taker").epoch == 2


def test_fenced_state_changes(s1):
    """running/idle/release need the current owner and epoch; anything else is FencedError."""
    st = s1
    store.register_owner(st, "o1", ttl=60)
    lease = store.acquire_lease(st, "s1", "o1")
    assert store.set_lease_state(st, "s1", "o1", lease.epoch, "idle").state == "idle"
    assert store.read_lease(st, "s1").state == "idle"
    assert store.set_lease_state(st, "s1", "o1", lease.epoch, "idle").state == "idle"
    assert store.set_lease_state(st, "s1", "o1", lease.epoch, "running").acquired_at == lease.acquired_at
    for owner, epoch in (("o2", lease.epoch), ("o1", lease.epoch + 1), ("o1", 0)):
        with pytest.raises(store.FencedError):
            store.set_lease_state(st, "s1", owner, epoch, "idle")
        with pytest.raises(store.FencedError):
            store.release_lease(st, "s1", owner, epoch)
    assert store.read_lease(st, "s1") == store.Lease("o1", 1, "running", lease.acquired_at)
    store.release_lease(st, "s1", "o1", 1)
    store.register_owner(st, "o2", ttl=60)
    store.acquire_lease(st, "s1", "o2")
    with pytest.raises(store.FencedError) as info:
        store.set_lease_state(st, "s1", "o1", 1, "running")
    assert info.value.current_epoch == 2


def test_session_status(st):
    """complete without a lease, when released or when the owner is dead; else the lease state."""
    store.create_session(st, "s1")
    assert store.session_status(st, "s1") == "complete"
    store.register_owner(st, "o1", ttl=60)
    lease = store.acquire_lease(st, "s1", "o1")
    assert store.session_status(st, "s1") == "running"
    store.set_lease_state(st, "s1", "o1", lease.epoch, "idle")
    assert store.session_status(st, "s1") == "idle"
    store.release_lease(st, "s1", "o1", lease.epoch)
    assert store.session_status(st, "s1") == "complete"
    store.acquire_lease(st, "s1", "o1")
    store.remove_owner(st, "o1")
    assert store.session_status(st, "s1") == "complete"


def test_owner_cache_reads_each_owner_once(st, monkeypatch):
    """One query reads each owner's heartbeat once, however many leases it holds."""
    store.register_owner(st, "o1", ttl=60)
    cache = store.OwnerCache(st)
    calls = []
    real = store.lease.read_owner
    monkeypatch.setattr(store.lease, "read_owner", lambda s, o: calls.append(o) or real(s, o))
    assert cache.alive("o1") and cache.alive("o1") and not cache.alive("ghost")
    assert calls == ["o1", "ghost"]


def test_lease_of_an_unknown_session(st):
    """Leasing an id with no session file is SessionNotFoundError and leaves no file behind."""
    store.register_owner(st, "o1", ttl=60)
    with pytest.raises(store.SessionNotFoundError):
        store.acquire_lease(st, "ghost", "o1")
    with pytest.raises(store.SessionNotFoundError):
        store.set_lease_state(st, "ghost", "o1", 1, "idle")
    with pytest.raises(store.SessionNotFoundError):
        store.release_lease(st, "ghost", "o1", 1)
    assert os.listdir(st.sessions_dir) == []
    store.create_session(st, "ghost")  # the id is still free
    assert store.session_status(st, "ghost") == "complete"


def test_session_created_already_leased(st):
    """create_session(lease_owner=...) publishes the session leased at epoch 1 to its creator."""
    store.register_owner(st, "creator", ttl=60)
    store.create_session(st, "s1", lease_owner="creator", events=[("turn/start", {})])
    lease = store.read_lease(st, "s1")
    assert (lease.owner, lease.epoch, lease.state) == ("creator", 1, "running")
    with pytest.raises(store.LeaseHeldError):
        store.acquire_lease(st, "s1", "other")
    with pytest.raises(store.FencedError):
        store.LogWriter.open(st, "s1", epoch=0)
    with store.LogWriter.open(st, "s1", epoch=1) as writer:
        assert [(r["type"], r["epoch"]) for r in writer.repaired] == [("turn/end", 1)]


def test_lock_timeout_is_a_typed_error(tmp_path, monkeypatch) -> None:
    """A lock held past its timeout raises LockTimeoutError (a SubagentError and a TimeoutError)."""
    import fcntl

    from subagents import store as _store
    from subagents.store import locks

    st = _store.Store(tmp_path / "s", durability="none")
    _store.create_session(st, "s1")
    monkeypatch.setattr(locks, "LOCK_TIMEOUT_S", 0.05)
    holder = os.open(st.session_path("s1"), os.O_RDONLY)  # the session's lock is an flock on its file
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        with pytest.raises(_store.LockTimeoutError) as caught:
            _store.acquire_lease(st, "s1", "o1")
        assert isinstance(caught.value, TimeoutError) and caught.value.code == "LOCK_TIMEOUT"
    finally:
        os.close(holder)


def test_a_heartbeat_renews_the_owner_file_in_place(st):
    """A heartbeat sets the owner file's modification time: the same inode, the same bytes, no file
    made or removed (a supervisor renews every TTL/3 for as long as it runs). Readers take the later
    of the record's time and the file's; a file removed by hand is written again whole."""
    record = store.register_owner(st, "o1", ttl=30.0)
    path = st.owner_path("o1")
    before = os.stat(path)
    with open(path, "rb") as handle:
        content = handle.read()
    time.sleep(0.01)  # a later clock reading than the registration's
    fresh = store.heartbeat(st, record)
    after = os.stat(path)
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size) and os.listdir(st.owners_dir) == ["o1"]
    with open(path, "rb") as handle:
        assert handle.read() == content
    assert fresh.heartbeat_at > record.heartbeat_at and store.read_owner(st, "o1") == fresh
    old = time.time() - 3600
    os.utime(path, (old, old))  # a file time older than the record's: the record's counts
    assert store.read_owner(st, "o1").heartbeat_at == record.heartbeat_at
    os.unlink(path)
    again = store.heartbeat(st, record)
    assert store.read_owner(st, "o1") == again


def test_an_owner_record_without_the_renewal_key_is_judged_by_its_own_time(st):
    """A record written by a build that replaced the file at each heartbeat carries no "renewal":
    a fresh file time (a copy that did not keep times) never makes that old owner look alive."""
    import msgpack

    old = time.time() - 3600
    record = {"owner": "o1", "host": "elsewhere/boot", "pid": 1, "pid_start": None, "started_at": old, "heartbeat_at": old, "ttl": 5.0}
    write_file(st.owner_path("o1"), msgpack.packb(record))  # its file time is now
    read = store.read_owner(st, "o1")
    assert read.heartbeat_at == old and not store.owner_alive(read)
    write_file(st.owner_path("o1"), msgpack.packb({**record, "renewal": "mtime"}))
    assert store.owner_alive(store.read_owner(st, "o1"))  # renewed through its file time: fresh


def test_a_written_owner_file_reads_back_as_the_record_its_writer_returned(st):
    """``register_owner`` and a heartbeat that writes a removed file again return the record a
    reader then reads. Readers take the later of the record's time and the file's, and a new
    file's time is the clock's coarse tick at its write, which can follow the record's reading of
    the fine clock (a tick between the two; under load, often): the writer sets the file's time
    to the record's. Many rounds, as the window is a tick's fraction."""
    for round_ in range(500):
        owner = f"o{round_}"
        record = store.register_owner(st, owner, ttl=30.0)
        assert store.read_owner(st, owner) == record, round_
        os.unlink(st.owner_path(owner))
        again = store.heartbeat(st, record)
        assert store.read_owner(st, owner) == again, round_
        store.remove_owner(st, owner)


def test_two_empty_slots_beside_a_log_written_under_a_lease_are_damage(s1):
    """Both slots zeroed behind the store's back read as "never leased", and an acquisition took epoch 1
    again after records of epoch 2 (a probe found it: ``check`` then said ``epoch-regressed``, and a
    writer fenced at epoch 1 could have written again). The slots are refused as damaged instead,
    nothing written; a session never written under a lease may still be taken from empty slots."""
    from ..session_bytes import file_bytes, write_slot

    st = s1
    for _ in range(2):
        epoch = store.acquire_lease(st, "s1", "o1").epoch
        with store.LogWriter.open(st, "s1", epoch=epoch) as writer:
            writer.append([("turn/start", {}), ("turn/end", {"stop_reason": "completed"})], commit=True)
        store.release_lease(st, "s1", "o1", epoch)
    for index in (0, 1):
        write_slot(st, "s1", index, b"")
    before = file_bytes(st, "s1")
    with pytest.raises(store.CorruptSessionError, match="epoch 2"):
        store.acquire_lease(st, "s1", "o1")
    assert file_bytes(st, "s1") == before

    store.create_session(st, "s2")
    for index in (0, 1):
        write_slot(st, "s2", index, b"")
    assert store.acquire_lease(st, "s2", "o1").epoch == 1
