"""``migrate``: a store of format version 1, 2 or 3 converted in place to version 4 (issue 12).

The version-1 stores are written byte for byte (``_v1_store.py``). After the
conversion every session reads as it did: the same events (a torn tail stays
torn), the same pending mail and control requests, the same lease epoch, the
same children in the catalog; a crashed creation is gone and an unfinished
``gc`` is finished by the next one. A store in use is refused before any byte
changes; a store already converted is a no-op.
"""

from __future__ import annotations

import json
import os

import msgpack
import pytest

from subagents import store
from subagents.store import Store, StoreFormatError, StoreNotFoundError, inspect, list_children, read_controls, read_lease
from subagents.store.description import mailbox_counts
from subagents.store.fsck import fsck
from subagents.store.lease import host_identity, process_start_time
from subagents.store.migrate import StoreInUseError, migrate

from ._v1_store import ONE_SHOT, V1Store, build_sample, demote, snapshot, v1_event, v3_store


def test_a_v1_store_is_refused_with_the_command_that_converts_it(tmp_path):
    build_sample(tmp_path / "s")
    with pytest.raises(StoreFormatError) as caught:
        Store(tmp_path / "s", create=False)
    assert "subagents store migrate" in caught.value.message


def test_every_session_reads_as_it_did(tmp_path):
    sample = build_sample(tmp_path / "s")
    before = snapshot(tmp_path / "s")
    report = migrate(tmp_path / "s", durability="strict")
    assert (report.from_version, report.converted, report.already, report.debris, report.trash, report.resumed) == (1, 5, 0, 1, 1, False)
    st = Store(tmp_path / "s", create=False)
    assert st.session_ids() == ["c1", "c2", "c3", "r1", "r2"]
    for session_id, events in sample["events"].items():
        found = inspect(st, session_id)
        assert found.events == events, session_id
        assert found.status == ("torn" if session_id == "c1" else "clean"), session_id
    assert inspect(st, "c1").size == len(before["sessions/c1/log"])  # the torn bytes are kept, as version 1 kept them
    # header bytes, identity cache, mailbox and control: the same bytes
    for session_id in ("c1", "c2", "c3", "r1"):
        assert open(st.path(session_id, "identity"), "rb").read() == before[f"sessions/{session_id}/identity"]
    assert not os.path.exists(os.path.join(st.sessions_dir, "r2.identity"))  # absent stays absent
    assert open(st.path("c2", "mailbox"), "rb").read() == before["sessions/c2/mailbox"]
    assert [c.id for c in read_controls(st, "c2")] == ["q1"]
    counts = mailbox_counts(st, "c2", store.read_projection(st, "c2"))
    assert (counts.accepted, counts.pending) == (3, 2)
    for session_id, epoch in sample["epochs"].items():
        assert read_lease(st, session_id).epoch == epoch
    assert read_lease(st, "c3").state == "running" and read_lease(st, "r2") is None
    rows = list_children(st, "r1")
    assert [(r.id, r.status) for r in rows] == [("c1", "complete"), ("c2", "complete"), ("c3", "complete")]
    assert rows[2].outcome == "crashed"  # a turn open under a dead owner, as version 1 listed it
    assert [r.id for r in store.list_roots(st)] == ["r1", "r2"]
    assert store.check_store(st).clean
    assert fsck(st, repair=False, lease_ttl_s=10.0)["counts"] == {"clean": 4, "torn": 1, "corrupt": 0, "unsupported": 0, "unreadable": 0}
    # nothing of version 1 is left beside the sessions
    assert sorted(os.listdir(st.sessions_dir)) == sorted([
        "c1", "c1.identity", "c2", "c2.identity", "c2.mailbox", "c2.control", "c3", "c3.identity", "r1", "r1.identity", "r2"])


def test_a_lease_continues_from_its_epoch(tmp_path):
    build_sample(tmp_path / "s")
    migrate(tmp_path / "s")
    st = Store(tmp_path / "s", create=False)
    lease = store.acquire_lease(st, "c2", "newOwner")
    assert lease.epoch == 3  # the dead owner's idle lease at epoch 2 is taken over
    with store.LogWriter.open(st, "c2", epoch=lease.epoch) as writer:
        writer.append([("turn/start", {}), ("turn/end", {"stop_reason": "completed"})], commit=True)
    store.release_lease(st, "c2", "newOwner", lease.epoch)
    assert len(inspect(st, "c2").events) == 6


def test_the_unfinished_gc_is_converted_and_the_next_gc_finishes_it(tmp_path):
    build_sample(tmp_path / "s")
    migrate(tmp_path / "s")
    entry = tmp_path / "s" / "trash" / "t1.0badcafe"
    assert sorted(os.listdir(entry)) == ["identity", "session"]
    st = Store(tmp_path / "s", create=False)
    report = store.collect(st, 10 * 365 * 86400.0)
    assert report.finished == 1
    assert sorted(os.listdir(tmp_path / "s" / "trash")) == [".lock", ".reserve"]
    assert "t1" not in [r.id for r in store.list_roots(st)]


def test_a_second_run_is_a_no_op(tmp_path):
    build_sample(tmp_path / "s")
    migrate(tmp_path / "s")
    after = snapshot(tmp_path / "s")
    report = migrate(tmp_path / "s")
    assert (report.from_version, report.converted, report.already, report.steps) == (4, 0, 5, 0)
    assert snapshot(tmp_path / "s") == after


def test_a_live_owner_refuses_before_anything_changes(tmp_path):
    build_sample(tmp_path / "s")
    pid = os.getpid()
    V1Store.owner_file(tmp_path / "s", "liveOwner", {
        "owner": "liveOwner", "host": host_identity(), "pid": pid, "pid_start": process_start_time(pid),
        "started_at": 0.0, "heartbeat_at": 0.0, "ttl": 1.0,  # a late heartbeat: its process still runs here
    })
    before = snapshot(tmp_path / "s")
    with pytest.raises(StoreInUseError) as caught:
        migrate(tmp_path / "s")
    assert caught.value.code == "STORE_IN_USE" and "liveOwner" in caught.value.message
    assert snapshot(tmp_path / "s") == before


def test_not_a_store(tmp_path):
    with pytest.raises(StoreNotFoundError):
        migrate(tmp_path / "absent")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "STORE").write_bytes(b"\x93\x01\x02\x03")
    with pytest.raises(StoreFormatError):
        migrate(tmp_path / "other")


def test_a_damaged_lease_becomes_released_past_every_epoch_of_the_log(tmp_path):
    v1 = V1Store(tmp_path / "s")
    v1.session("x1", [v1_event(0, "subagent/descriptor", ONE_SHOT), v1_event(1, "turn/start", epoch=4)], lease=None)
    (tmp_path / "s" / "sessions" / "x1" / "lease").write_bytes(b"\xc1garbage")
    report = migrate(tmp_path / "s")
    assert report.leases_rebuilt == 1
    st = Store(tmp_path / "s", create=False)
    assert (read_lease(st, "x1").state, read_lease(st, "x1").epoch) == ("released", 4)
    assert store.acquire_lease(st, "x1", "newOwner").epoch == 5


def test_a_store_a_supervisor_wrote_round_trips(tmp_path):
    """The current build's own sessions, demoted to version 1 and migrated back: the same bytes."""
    st = Store(tmp_path / "s", durability="none")
    store.create_session(st, "p1", label="p")
    store.create_session(st, "k1", parent_session="p1", origin="subagent", delegation_depth=1,
                         events=[("subagent/descriptor", dict(ONE_SHOT))], lease_owner="someOwner")
    store.accept(st, "k1", source={"kind": "parent"}, content="hi", ids=store.IdGenerator())
    sessions = {sid: open(st.session_path(sid), "rb").read() for sid in ("p1", "k1")}
    demote(tmp_path / "s")
    migrate(tmp_path / "s")
    for session_id, blob in sessions.items():
        assert open(st.session_path(session_id), "rb").read() == blob


@pytest.mark.anyio
async def test_a_new_supervisor_resumes_a_child_of_a_converted_store(tmp_path):
    """A settled continuable child a real supervisor made, its store demoted to version 1 and
    migrated: a new supervisor follows it up, and the transcript holds both turns."""
    from subagents.supervisor import Capabilities, ContinuableSpec, Provider, Supervisor, SupervisorConfig

    config = SupervisorConfig(pool_size=1, durability="none")
    script = Provider(name="custom", program="script", capabilities=Capabilities.all(), continuable=True)
    async with Supervisor.open(store=tmp_path / "s", config=config) as sup:
        sup.register_provider(script)
        root = await sup.open_root(label="r")
        child, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="custom", prompt=json.dumps({"script": [{"return": "first"}]}), label="c"))
        await sup.wait_for_message(root, timeout_s=30)
        root_id = root.id
    demote(tmp_path / "s")
    with pytest.raises(StoreFormatError):
        Store(tmp_path / "s", create=False)
    migrate(tmp_path / "s")
    async with Supervisor.open(store=tmp_path / "s", config=config) as sup:
        root = await sup.open_root(id=root_id)
        await sup.followup(root, child, json.dumps({"script": [{"return": "again"}]}))
        [notice] = await sup.wait_for_message(root, timeout_s=30)
        assert notice.content.endswith("Its closing message:\nagain")
    st = Store(tmp_path / "s", create=False)
    ends = [e for e in inspect(st, child).events if e["type"] == "turn/end"]
    assert [e["data"]["stop_reason"] for e in ends] == ["completed", "completed"]


def test_the_cli_converts_and_says_what_it_did(tmp_path):
    from tests.supervisor.test_cli import cli

    build_sample(tmp_path / "s")
    listed = cli("--store", str(tmp_path / "s"), "ls", cwd=tmp_path)
    assert listed.returncode == 2
    assert listed.stderr.startswith("error: STORE_FORMAT: ") and "subagents store migrate" in listed.stderr
    done = cli("--store", str(tmp_path / "s"), "store", "migrate", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines() == [
        "converted to format version 4: 5 sessions converted, 0 already converted, 1 crashed creations removed, 1 trash entries converted"]
    again = cli("--store", str(tmp_path / "s"), "store", "migrate", "--json", cwd=tmp_path)
    assert again.returncode == 0 and json.loads(again.stdout)["already"] == 5
    assert cli("--store", str(tmp_path / "s"), "ls", cwd=tmp_path).returncode == 0


def test_the_cli_names_a_store_in_use(tmp_path):
    from tests.supervisor.test_cli import cli

    build_sample(tmp_path / "s")
    pid = os.getpid()
    V1Store.owner_file(tmp_path / "s", "liveOwner", {
        "owner": "liveOwner", "host": host_identity(), "pid": pid, "pid_start": process_start_time(pid),
        "started_at": 0.0, "heartbeat_at": 1e12, "ttl": 60.0,
    })
    done = cli("--store", str(tmp_path / "s"), "store", "migrate", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("error: STORE_IN_USE: ") and "Traceback" not in done.stderr


def test_one_migration_at_a_time(tmp_path):
    import fcntl

    build_sample(tmp_path / "s")
    before = snapshot(tmp_path / "s")
    fd = os.open(tmp_path / "s", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what a running migration holds
        with pytest.raises(StoreInUseError, match="another `subagents store migrate`"):
            migrate(tmp_path / "s")
    finally:
        os.close(fd)
    assert snapshot(tmp_path / "s") == before
    assert migrate(tmp_path / "s").converted == 5


@pytest.mark.parametrize("limit", [None, 4096])
def test_the_marker_keeps_its_record_limit(tmp_path, limit):
    V1Store(tmp_path / "s", max_record_bytes=limit)
    migrate(tmp_path / "s")
    assert Store(tmp_path / "s", create=False).max_record_bytes == (limit or 16 * 1024 * 1024)


def test_a_link_in_a_sessions_place_is_never_followed(tmp_path):
    outside = tmp_path / "outside"
    V1Store(tmp_path / "elsewhere").session("o1", [v1_event(0, "turn/start")], folder=str(outside))
    v1 = V1Store(tmp_path / "s")
    v1.session("a1", [v1_event(0, "turn/start")])
    os.symlink(outside, tmp_path / "s" / "sessions" / "o1")
    before = snapshot(outside)
    assert migrate(tmp_path / "s").converted == 1
    assert os.path.islink(tmp_path / "s" / "sessions" / "o1") and snapshot(outside) == before
    assert Store(tmp_path / "s", create=False).session_ids() == ["a1"]


def test_a_version_2_store_is_converted_by_its_marker_alone(tmp_path):
    """Every version-2 session file is a version-4 file: the conversion rewrites the marker and nothing else,
    keeps its record limit, and a writer of the converted store pads the logs it appends to."""
    build_sample(tmp_path / "s")
    migrate(tmp_path / "s")
    marker = tmp_path / "s" / "STORE"
    info = msgpack.unpackb(marker.read_bytes())
    marker.write_bytes(msgpack.packb({**info, "version": 2, "max_record_bytes": 4096}))  # as a build of version 2 left it
    before = snapshot(tmp_path / "s")
    with pytest.raises(StoreFormatError) as caught:
        Store(tmp_path / "s", create=False)
    assert "subagents store migrate" in caught.value.message and "version 2" in caught.value.message
    report = migrate(tmp_path / "s")
    assert (report.from_version, report.to_version, report.converted, report.already, report.steps) == (2, 4, 0, 5, 1)
    after = snapshot(tmp_path / "s")
    assert msgpack.unpackb(after.pop("STORE")) == {"format": "subagents-store", "version": 4, "max_record_bytes": 4096}
    assert after == {k: v for k, v in before.items() if k != "STORE"}
    st = Store(tmp_path / "s", create=False)
    assert [inspect(st, sid).status for sid in st.session_ids()] == ["torn", "clean", "clean", "clean", "clean"]
    lease = store.acquire_lease(st, "c2", "newOwner")
    with store.LogWriter.open(st, "c2", epoch=lease.epoch) as writer:
        writer.append([("turn/start", {}), ("turn/end", {"stop_reason": "completed"})], commit=True)
    assert os.path.getsize(st.session_path("c2")) % 4096 == 0  # padded from its first append on
    assert migrate(tmp_path / "s").steps == 0


def test_a_live_owner_refuses_the_version_2_conversion(tmp_path):
    build_sample(tmp_path / "s")
    migrate(tmp_path / "s")
    marker = tmp_path / "s" / "STORE"
    marker.write_bytes(msgpack.packb({**msgpack.unpackb(marker.read_bytes()), "version": 2}))
    pid = os.getpid()
    V1Store.owner_file(tmp_path / "s", "liveOwner", {
        "owner": "liveOwner", "host": host_identity(), "pid": pid, "pid_start": process_start_time(pid),
        "started_at": 0.0, "heartbeat_at": 0.0, "ttl": 1.0,
    })
    before = snapshot(tmp_path / "s")
    with pytest.raises(StoreInUseError):
        migrate(tmp_path / "s")
    assert snapshot(tmp_path / "s") == before


def _owner_appears_after_the_first_marker_write(monkeypatch, root):
    """A supervisor of the old version opens the store just as the marker changes: its owner file appears right
    after migrate's first write of the marker (the real write), before migrate checks the owners again."""
    import subagents.store.migrate as module

    real = module.write_atomic
    writes: list[str] = []

    def write_then_open_a_supervisor(path, data, **kw):
        real(path, data, **kw)
        if os.path.basename(path) == "STORE" and not writes:
            pid = os.getpid()
            V1Store.owner_file(root, "lateOwner", {
                "owner": "lateOwner", "host": host_identity(), "pid": pid, "pid_start": process_start_time(pid),
                "started_at": 0.0, "heartbeat_at": 0.0, "ttl": 1.0,
            })
        writes.append(os.path.basename(path))

    monkeypatch.setattr(module, "write_atomic", write_then_open_a_supervisor)
    return writes


@pytest.mark.parametrize("version", [1, 2])
def test_a_supervisor_that_opened_the_store_during_the_marker_change_gets_its_marker_back(tmp_path, monkeypatch, version):
    """Between migrate's owner check and its new marker, a supervisor of the old version may open the store; the
    check after the marker finds it, puts the old marker back (``STORE_IN_USE``) and changes nothing else, so the
    supervisor goes on with the store as it read it, and a later run converts it."""
    build_sample(tmp_path / "s")
    if version == 2:
        migrate(tmp_path / "s")
        marker = tmp_path / "s" / "STORE"
        marker.write_bytes(msgpack.packb({**msgpack.unpackb(marker.read_bytes()), "version": 2}))
    before = snapshot(tmp_path / "s")
    writes = _owner_appears_after_the_first_marker_write(monkeypatch, tmp_path / "s")
    with pytest.raises(StoreInUseError) as caught:
        migrate(tmp_path / "s")
    assert caught.value.code == "STORE_IN_USE" and "lateOwner" in caught.value.message
    assert writes == ["STORE", "STORE"]  # the new marker, then the old one back
    after = snapshot(tmp_path / "s")
    assert {k: v for k, v in after.items() if "lateOwner" not in k} == before
    assert msgpack.unpackb(after["STORE"])["version"] == version


@pytest.mark.parametrize("version", [2, 3])
def test_the_cli_says_what_a_version_2_or_3_conversion_did(tmp_path, version):
    """Not the version-1 line ("0 sessions converted, 5 already converted"), which would say an earlier run
    had converted them: the sessions stay as they are, and the lock files removed are counted."""
    from tests.supervisor.test_cli import cli

    v3_store(tmp_path / "s")
    marker = tmp_path / "s" / "STORE"
    marker.write_bytes(msgpack.packb({**msgpack.unpackb(marker.read_bytes()), "version": version}))
    done = cli("--store", str(tmp_path / "s"), "store", "migrate", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines() == [
        f"converted format version {version} to 4: 5 sessions kept as they are, 2 index lock files removed"]
    assert json.loads(cli("--store", str(tmp_path / "s"), "store", "migrate", "--json", cwd=tmp_path).stdout)["index_locks_removed"] == 0


def test_a_version_3_store_loses_its_index_lock_files_and_nothing_else(tmp_path):
    """Version 4 locks each index itself: the conversion removes the lock files version 3 kept beside
    them, then replaces the marker. No session or index byte changes, and the converted store appends
    to an index without making a lock file again."""
    locks = v3_store(tmp_path / "s")
    before = snapshot(tmp_path / "s")
    with pytest.raises(StoreFormatError) as caught:
        Store(tmp_path / "s", create=False)
    assert "subagents store migrate" in caught.value.message and "version 3" in caught.value.message
    report = migrate(tmp_path / "s")
    assert (report.from_version, report.to_version, report.converted, report.already, report.steps) == (3, 4, 0, 5, 3)
    after = snapshot(tmp_path / "s")
    assert msgpack.unpackb(after.pop("STORE"))["version"] == 4
    gone = {os.path.relpath(p, tmp_path / "s") for p in locks}
    assert after == {k: v for k, v in before.items() if k != "STORE" and k not in gone}
    st = Store(tmp_path / "s", create=False)
    store.create_session(st, "c4", parent_session="r1", origin="subagent", events=[("subagent/descriptor", ONE_SHOT)])
    assert [r.id for r in list_children(st, "r1")] == ["c1", "c2", "c3", "c4"]
    assert sorted(os.listdir(os.path.join(st.root, "index", "children"))) == ["r1"]
    assert migrate(tmp_path / "s").steps == 0


def _store_of_version(root, version: int) -> None:
    if version == 1:
        build_sample(root)
    elif version == 3:
        v3_store(root)
    else:
        build_sample(root)
        migrate(root)


@pytest.mark.parametrize("version", [1, 3, 4])
@pytest.mark.parametrize("folder", ["sessions", "owners", "index", os.path.join("index", "children")])
def test_a_store_missing_one_of_its_folders_is_refused_naming_it(tmp_path, version, folder):
    """Found by a probe: with ``sessions/`` gone, migrate died on a bare ``FileNotFoundError`` (``OS_ERROR``);
    with ``owners/`` or ``index/`` gone, a converted store's migrate said "nothing to convert" and exited 0,
    while every other verb refuses the store. Now migrate refuses it as they do, by the same check
    (``STORE_FORMAT`` naming the folder and what to do), before anything changes, whatever its version."""
    _store_of_version(tmp_path / "s", version)
    target = tmp_path / "s" / folder
    for path in sorted(target.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    target.rmdir()
    before = snapshot(tmp_path / "s")
    with pytest.raises(StoreFormatError) as caught:
        migrate(tmp_path / "s")
    assert caught.value.code == "STORE_FORMAT"
    assert f"has no {folder}/ folder (moved or deleted?)" in caught.value.message, caught.value.message
    assert snapshot(tmp_path / "s") == before
    if version == 4:
        with pytest.raises(StoreFormatError) as opened:
            Store(tmp_path / "s", create=False)
        assert opened.value.message == caught.value.message


@pytest.mark.parametrize("folder", ["sessions", "owners", "index"])
def test_the_cli_refuses_to_migrate_a_store_missing_one_of_its_folders(tmp_path, folder):
    from tests.supervisor.test_cli import cli

    _store_of_version(tmp_path / "s", 4)
    target = tmp_path / "s" / folder
    for path in sorted(target.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    target.rmdir()
    listed = cli("--store", str(tmp_path / "s"), "ls", cwd=tmp_path)
    done = cli("--store", str(tmp_path / "s"), "store", "migrate", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, ""), (done.stdout, done.stderr)
    assert done.stderr.startswith("error: STORE_FORMAT: ") and f"has no {folder}/ folder" in done.stderr, done.stderr
    assert done.stderr == listed.stderr
