"""A full disk: every write the store cannot make whole is refused with ``DURABILITY_FAILED``, and
nothing is lost or left behind; once space is freed, the same supervisor goes on.

A real ext4 (the ``disk`` fixture: 16 MiB in a loop-attached file) filled to its last block and
inode by a file of another program. Found this way: a ``followup`` of a large message on a full
disk returned as if accepted, the mailbox then held the first 4 KiB of it, and every later
message to that child was refused (its mailbox read as damaged).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from subagents import store
from subagents.store.fsck import fsck
from subagents.store.reserve import RESERVE_BYTES, keep_reserve, reserve_path, spend_reserve
from subagents.supervisor import ContinuableSpec, Provider, SubagentRequest, Supervisor, SupervisorConfig

from ..conftest import REPO_ROOT
from ..store._v1_store import build_sample, snapshot
from ._power_loss import LoopFs

pytestmark = pytest.mark.anyio


def fill(mount: Path) -> Path:
    """Take every free block and inode of the file system at ``mount`` (as root: the reserved ones
    too). Rounds of writes until one stores nothing: an fsync gives back the blocks ext4 held in
    reserve for the delayed allocation of the writes before it."""
    big = mount / "other-program.bin"
    (mount / "others").mkdir()
    fd = os.open(big, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            before = os.fstat(fd).st_size
            for size in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
                try:
                    while True:
                        os.write(fd, b"x" * size)
                except OSError:
                    continue
            os.fsync(fd)
            if os.fstat(fd).st_size == before:
                break
    finally:
        os.close(fd)
    take_inodes(mount / "others")
    return big


def take_inodes(folder: Path) -> None:
    """Make empty files in ``folder`` (which exists) until the file system refuses one."""
    made = 0
    while True:
        try:
            (folder / str(made)).touch()
        except OSError:
            return
        made += 1


def take_every_inode(mount: Path) -> None:
    """Every inode of the file system at ``mount``, its blocks left free."""
    (mount / "others").mkdir()
    take_inodes(mount / "others")
    assert os.statvfs(mount).f_bfree > 1000  # blocks are left: only the inodes ran out


def script(*actions: dict) -> str:
    return json.dumps({"script": list(actions)})


async def test_a_full_disk_refuses_starts_and_messages_and_loses_nothing(disk: LoopFs) -> None:
    root_dir = disk.mount / "store"
    config = SupervisorConfig(pool_size=1, durability="batched")
    async with Supervisor.open(store=str(root_dir), config=config) as sup:
        sup.register_provider(Provider(name="script", program="script", continuable=True))
        root = await sup.open_root(label="main")
        first = await sup.start("script", SubagentRequest(parent=root, prompt=script({"return": "before"})))
        assert (await first.result()).output == "before"
        child, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", label="helper",
                                                               prompt=script({"return": "ready"})))
        await sup.wait_for_message(root, timeout_s=30)
        sessions = sorted(os.listdir(root_dir / "sessions"))
        big = fill(disk.mount)

        with pytest.raises(store.SubagentError) as refused:
            await sup.start("script", SubagentRequest(parent=root, prompt=script({"return": "never"})))
        assert refused.value.code == "DURABILITY_FAILED"
        with pytest.raises(store.SubagentError) as refused:
            await sup.followup(root, child, script({"say": "y" * 200_000}, {"return": "big"}))
        assert refused.value.code == "DURABILITY_FAILED"
        assert sorted(os.listdir(root_dir / "sessions")) == sessions  # no session, no companion half made

        big.unlink()
        await sup.followup(root, child, script({"return": "after"}))
        notice = await sup.wait_for_message(root, timeout_s=30)
        assert any("after" in str(m.content) for m in notice), notice
        again = await sup.start("script", SubagentRequest(parent=root, prompt=script({"return": "again"})))
        assert (await again.result()).output == "again"
        rows = {r.id: (r.status, r.outcome) for r in await sup.list_children(root.id)}
        assert rows[first.id] == rows[child] == rows[again.id] == ("complete", "completed"), rows
    st = store.Store(str(root_dir), create=False)
    report = store.check_store(st)
    assert report.clean, str(report)
    assert fsck(st, repair=False, lease_ttl_s=5.0)["findings"] == []


async def test_a_turn_whose_output_does_not_fit_ends_as_an_error_not_a_crash(disk: LoopFs, tmp_path: Path) -> None:
    """The disk fills while a turn runs; its 200 KB message cannot be written. The append is cut
    back whole and the turn ends ``error`` with the reason (its closing record fits where the log's
    last block already is), instead of leaving an open turn that lists as a crash."""
    root_dir = disk.mount / "store"
    gate = tmp_path / "gate"  # off the full disk: opening it needs no space there
    async with Supervisor.open(store=str(root_dir), config=SupervisorConfig(pool_size=1, durability="batched")) as sup:
        sup.register_provider(Provider(name="script", program="script"))
        root = await sup.open_root(label="main")
        run = await sup.start("script", SubagentRequest(parent=root, prompt=script({"hold": str(gate)}, {"say": "y" * 200_000},
                                                                                      {"return": "big"})))
        big = fill(disk.mount)
        gate.touch()
        result = await run.result()

        assert result.stop_reason == "error" and "DURABILITY_FAILED" in (result.diagnostic or ""), result
        [row] = await sup.list_children(root.id)
        assert (row.status, row.outcome) == ("complete", "error") and "DURABILITY_FAILED" in (row.error or ""), row
        big.unlink()
        after = await sup.start("script", SubagentRequest(parent=root, prompt=script({"return": "after"})))
        assert (await after.result()).output == "after"
    st = store.Store(str(root_dir), create=False)
    assert store.check_store(st).clean
    assert fsck(st, repair=False, lease_ttl_s=5.0)["findings"] == []


async def test_a_turn_whose_returned_output_does_not_fit_ends_as_an_error_not_a_crash(disk: LoopFs, tmp_path: Path) -> None:
    """Found by a probe: the same for a program's return value, which goes out in the turn's closing
    append itself. That append failed for room and the turn ended with no ``turn/end``: its caller
    heard ``error``, and its row listed ``crashed`` for good while ``store check`` said clean."""
    root_dir = disk.mount / "store"
    gate = tmp_path / "gate"
    async with Supervisor.open(store=str(root_dir), config=SupervisorConfig(pool_size=1, durability="batched")) as sup:
        sup.register_provider(Provider(name="script", program="script"))
        root = await sup.open_root(label="main")
        run = await sup.start("script", SubagentRequest(parent=root, prompt=script({"hold": str(gate)}, {"return": "z" * 200_000})))
        big = fill(disk.mount)
        gate.touch()
        result = await run.result()

        assert result.stop_reason == "error" and "DURABILITY_FAILED" in (result.diagnostic or ""), result
        assert "closing message cannot be stored" in result.diagnostic
        [row] = await sup.list_children(root.id)
        assert (row.status, row.outcome) == ("complete", "error") and "DURABILITY_FAILED" in (row.error or ""), row
        big.unlink()
    st = store.Store(str(root_dir), create=False)
    assert store.check_store(st).clean


async def test_no_inode_left_refuses_a_creation_with_its_code(disk: LoopFs) -> None:
    """Blocks free but every inode taken: a new session's file cannot be made. ``start`` and
    ``open_root`` fail with ``DURABILITY_FAILED`` (not a bare ``OSError``) and leave nothing."""
    root_dir = disk.mount / "store"
    async with Supervisor.open(store=str(root_dir), config=SupervisorConfig(pool_size=1, durability="batched")) as sup:
        sup.register_provider(Provider(name="script", program="script"))
        root = await sup.open_root(label="main")
        sessions = sorted(os.listdir(root_dir / "sessions"))
        take_every_inode(disk.mount)
        with pytest.raises(store.SubagentError) as refused:
            await sup.start("script", SubagentRequest(parent=root, prompt=script({"return": "never"})))
        assert refused.value.code == "DURABILITY_FAILED" and "No space left" in refused.value.message
        with pytest.raises(store.SubagentError) as refused:
            await sup.open_root(label="another")
        assert refused.value.code == "DURABILITY_FAILED"
        assert sorted(os.listdir(root_dir / "sessions")) == sessions
        for n in range(10):
            (disk.mount / "others" / str(n)).unlink()
        again = await sup.start("script", SubagentRequest(parent=root, prompt=script({"return": "again"})))
        assert (await again.result()).output == "again"
    assert store.check_store(store.Store(str(root_dir), create=False)).clean


@pytest.mark.parametrize("what", ["mailbox", "control"])
def test_a_first_message_or_control_request_with_no_inode_left_is_a_durability_failure(disk: LoopFs, what: str) -> None:
    """A session's mailbox and control file are made by their first record; with no inode left that
    record is refused with ``DURABILITY_FAILED`` (the disk), not ``SESSION_UNAVAILABLE`` (which
    says the session's files are damaged or in the way), and the session reads as it did."""
    st = store.Store(str(disk.mount / "store"), durability="batched")
    store.create_session(st, "s1")
    take_every_inode(disk.mount)
    with pytest.raises(store.SubagentError) as refused:
        if what == "mailbox":
            store.accept(st, "s1", source={"kind": "user"}, content="hello", ids=store.IdGenerator())
        else:
            store.request(st, "s1", "interrupt", {}, ids=store.IdGenerator())
    assert refused.value.code == "DURABILITY_FAILED", refused.value
    assert sorted(os.listdir(st.sessions_dir)) == ["s1"] and store.inspect(st, "s1").status == "clean"


def test_a_root_made_with_the_last_inode_is_created_without_its_empty_index(disk: LoopFs) -> None:
    """A root's empty children index is made with it, best effort: with one inode left, the root's
    own file takes it and the root is created all the same; its first child then fails on the disk."""
    st = store.Store(str(disk.mount / "store"), durability="batched")
    store.create_session(st, "first")  # index/roots exists from here
    take_every_inode(disk.mount)
    (disk.mount / "others" / "0").unlink()  # one inode free
    store.create_session(st, "root")
    assert st.exists("root") and not os.path.exists(st.children_index_path("root"))
    assert sorted(r.id for r in store.list_roots(st)) == ["first", "root"]
    with pytest.raises(store.SubagentError) as refused:
        store.create_session(st, "child", parent_session="root")
    assert refused.value.code == "DURABILITY_FAILED"
    assert not st.exists("child") and store.check_store(st).clean


def test_gc_on_a_full_disk_without_a_reserve_says_it_needs_room_and_the_next_one_collects(disk: LoopFs) -> None:
    """gc moves each session it collects into a trash folder of its own (an inode and a block): on a
    full disk, with no reserve to spend (a store no supervisor opened, made with none), it cannot, and
    says so with ``DURABILITY_FAILED`` and what to do, changing nothing it cannot finish; once a little
    space is free the next gc collects the subtree, and makes the reserve."""
    st = store.Store(str(disk.mount / "store"), durability="batched")
    store.create_session(st, "old")
    for i in range(3):
        store.create_session(st, f"old{i}", parent_session="old")
    then = 1e9  # 2001: older than any age asked for
    for sid in ("old", "old0", "old1", "old2"):
        os.utime(st.session_path(sid), (then, then))
    big = fill(disk.mount)
    with pytest.raises(store.SubagentError) as refused:
        store.collect(st, 7 * 86400.0)
    assert refused.value.code == "DURABILITY_FAILED" and "free some space" in refused.value.message, refused.value
    assert st.session_ids() == ["old", "old0", "old1", "old2"] and store.check_store(st).clean
    assert not os.path.exists(reserve_path(st))
    big.unlink()
    report = store.collect(st, 7 * 86400.0)
    assert [c.id for c in report.collected] == ["old"] and st.session_ids() == []
    assert store.check_store(st).clean
    assert not report.reserve_spent and report.reserve_kept and os.path.getsize(reserve_path(st)) == RESERVE_BYTES


def old_subtrees(st: store.Store, roots: int, children: int) -> list[str]:
    """``roots`` top-level sessions with ``children`` children each, every child run and released by an
    owner (its release writes the ``settled`` row gc clears first: an index append), all of it old."""
    store.register_owner(st, "owner", ttl=60.0)
    ids = []
    for r in range(roots):
        root = f"old{r}"
        store.create_session(st, root)
        ids.append(root)
        for c in range(children):
            child = f"{root}c{c}"
            store.create_session(st, child, parent_session=root, origin="subagent", delegation_depth=1,
                                 events=[("subagent/descriptor", {"kind": "one-shot", "provider": "echo", "label": None})])
            lease = store.acquire_lease(st, child, "owner")
            with store.LogWriter.open(st, child, epoch=lease.epoch) as writer:
                writer.append([("turn/start", {}), ("turn/end", {"stop_reason": "completed"})], commit=True)
            store.release_lease(st, child, "owner", lease.epoch)
            ids.append(child)
    then = 1e9  # 2001: older than any age asked for
    for sid in ids:
        for name in os.listdir(st.sessions_dir):
            if name == sid or name.startswith(f"{sid}."):
                os.utime(os.path.join(st.sessions_dir, name), (then, then))
    return ids


@pytest.mark.parametrize("full", ["every-block", "every-inode"])
def test_gc_on_a_full_disk_spends_the_reserve_and_collects_everything(disk: LoopFs, full: str) -> None:
    """The store's reserve (made by a supervisor's start, ``keep_reserve``) is what lets gc begin on a
    disk with no block or no inode left: it spends it on its first trash folders and index appends,
    then deletes what it moved whenever room runs out again (each session deleted frees more than its
    trash folder took), so one reserve collects 48 sessions in one run. Nothing is left behind; once
    the other program's file is gone, the next gc makes the reserve again."""
    st = store.Store(str(disk.mount / "store"), durability="batched")
    ids = old_subtrees(st, roots=6, children=7)
    assert keep_reserve(st) and os.path.getsize(reserve_path(st)) == RESERVE_BYTES
    big = fill(disk.mount) if full == "every-block" else None
    if big is None:
        take_every_inode(disk.mount)
    report = store.collect(st, 7 * 86400.0)
    assert sorted(c.id for c in report.collected) == [f"old{r}" for r in range(6)] and report.sessions == len(ids) == 48
    assert report.reserve_spent and not report.reserve_kept and not os.path.exists(reserve_path(st))
    assert st.session_ids() == [] and sorted(os.listdir(st.trash_dir)) == [".lock"]
    assert store.check_store(st).clean
    found = fsck(st, repair=False, lease_ttl_s=5.0)
    assert not [f for f in found["findings"] if f["kind"] != "clean"], found["findings"]
    if big is not None:
        big.unlink()
    else:
        shutil.rmtree(disk.mount / "others")
    again = store.collect(st, 7 * 86400.0)
    assert again.collected == () and again.reserve_kept and os.path.getsize(reserve_path(st)) == RESERVE_BYTES


def test_the_reserve_is_made_only_with_room_to_spare_and_never_fails_its_caller(disk: LoopFs) -> None:
    """A supervisor's start makes it; on a disk without room to spare it is not made (it must never be
    what fills a disk), and nothing fails; a folder of another program in its place is never deleted."""
    st = store.Store(str(disk.mount / "store"), durability="batched")
    store.create_session(st, "s1")
    big = fill(disk.mount)
    assert not keep_reserve(st) and not os.path.exists(reserve_path(st))
    big.unlink()
    assert keep_reserve(st) and keep_reserve(st)  # the second finds it there
    os.unlink(reserve_path(st))
    os.makedirs(os.path.join(reserve_path(st), "theirs"))
    assert not spend_reserve(st) and os.path.isdir(os.path.join(reserve_path(st), "theirs"))


def test_the_cli_says_when_gc_spent_the_reserve(disk: LoopFs) -> None:
    """``subagents gc`` on a full disk collects, and says it spent the reserve and that the next start or
    gc with room makes it again; ``--json`` carries ``reserve_spent`` and ``reserve_kept``."""
    st = store.Store(str(disk.mount / "store"), durability="batched")
    old_subtrees(st, roots=2, children=2)
    assert keep_reserve(st)
    fill(disk.mount)
    done = subprocess.run([sys.executable, "-m", "subagents.supervisor.cli", "--store", st.root, "gc", "--older-than", "7d"],
                          cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": REPO_ROOT}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert ("the disk had no room left: gc spent the store's reserve (trash/.reserve) to begin; made again by the next "
            "start or gc with room to spare") in done.stdout, done.stdout
    assert "deleted 2 subtrees, 6 sessions" in done.stdout, done.stdout
    doc = json.loads(subprocess.run([sys.executable, "-m", "subagents.supervisor.cli", "--store", st.root, "gc", "--older-than",
                                     "7d", "--json"], cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": REPO_ROOT},
                                    capture_output=True, text=True, timeout=60, check=True).stdout)
    assert doc["collected"] == [] and doc["reserve_spent"] is False and doc["reserve_kept"] is False


KILLED_GC = """
import os, sys
from subagents import store
from subagents.store.retention import KILL_AFTER_ENV
os.environ[KILL_AFTER_ENV] = sys.argv[2]
store.collect(store.Store(sys.argv[1], create=False, durability="batched"), 7 * 86400.0)
"""
MAX_STEPS = 120


def test_gc_killed_at_any_step_on_a_disk_with_no_inode_left_leaves_a_store_the_next_gc_finishes(disk: LoopFs, tmp_path: Path) -> None:
    """The reserve's path (spend it, delete what was moved in the middle of a subtree, go on) cut at
    each of its steps (``SUBAGENTS_GC_KILL_AFTER``), each on its own copy of one full file system:
    every session is whole or gone and ``store check`` is clean; the next gc, on the disk still
    full, finishes what the killed one began and collects the rest; once the other program's files
    are gone, the next leaves nothing behind but its lock and a new reserve."""
    st = store.Store(str(disk.mount / "store"), durability="batched")
    ids = old_subtrees(st, roots=2, children=3)
    assert keep_reserve(st)
    take_every_inode(disk.mount)
    os.sync()
    finished = None
    for n in range(1, MAX_STEPS + 1):
        copy = tmp_path / f"k{n}.img"
        shutil.copyfile(disk.image, copy)
        fs = LoopFs(copy, tmp_path / f"k{n}")
        try:
            where = fs.mount / "store"
            done = subprocess.run([sys.executable, "-c", KILLED_GC, str(where), str(n)], cwd=REPO_ROOT,
                                  env={**os.environ, "PYTHONPATH": REPO_ROOT}, capture_output=True, text=True, timeout=60)
            copied = store.Store(str(where), create=False)
            if done.returncode == 0:
                finished = n
            else:
                assert done.returncode == -9, done.stderr
            present = copied.session_ids()
            assert set(present) <= set(ids)
            for sid in present:
                assert store.inspect(copied, sid).status == "clean", (n, sid)
            assert store.check_store(copied).clean, (n, str(store.check_store(copied)))
            # the disk still full, the reserve spent (by the killed gc, or now): the next gc finishes
            # what the killed one began, which frees the inodes to go on, and collects everything
            store.collect(copied, 7 * 86400.0)
            assert copied.session_ids() == [] and not os.path.exists(reserve_path(copied)), n
            assert store.check_store(copied).clean, (n, str(store.check_store(copied)))
            shutil.rmtree(fs.mount / "others")
            report = store.collect(copied, 7 * 86400.0)
            assert report.collected == () and report.reserve_kept, n
            assert sorted(os.listdir(copied.trash_dir)) == [".lock", ".reserve"], n
            assert store.check_store(copied).clean
            found = fsck(copied, repair=False, lease_ttl_s=5.0)
            assert not [f for f in found["findings"] if f["kind"] != "clean"], (n, found["findings"])
        finally:
            fs.close()
            copy.unlink()
        if finished is not None:
            break
    assert finished is not None, f"gc makes more than {MAX_STEPS} changes: raise MAX_STEPS"
    assert finished > 20  # the reserve spent, and more than one deletion in the middle of a subtree


@pytest.mark.parametrize("full", ["every-block", "every-inode"])
def test_migrate_on_a_full_disk_refuses_changing_nothing_and_finishes_once_there_is_room(disk: LoopFs, full: str) -> None:
    """``subagents store migrate`` of a version-1 store on a disk with no room: ``DURABILITY_FAILED``
    (exit 2, no traceback) before any file of the store changed; once space is freed the same command
    converts it and ``store check`` is clean."""
    root = disk.mount / "store"
    build_sample(root)
    before = snapshot(root)
    if full == "every-block":
        big = fill(disk.mount)
    else:
        take_every_inode(disk.mount)
    cli = [sys.executable, "-m", "subagents.supervisor.cli", "--store", str(root), "store"]
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    refused = subprocess.run([*cli, "migrate"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert refused.stderr.startswith("error: DURABILITY_FAILED: ") and "No space left on device" in refused.stderr, refused.stderr
    assert snapshot(root) == before
    if full == "every-block":
        big.unlink()
    else:
        shutil.rmtree(disk.mount / "others")
    done = subprocess.run([*cli, "migrate"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "converted to format version 4" in done.stdout, done.stderr
    checked = subprocess.run([*cli, "check"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and ": clean;" in checked.stdout, checked.stdout + checked.stderr


@pytest.mark.parametrize("command", [["store", "reindex"], ["demo"]])
@pytest.mark.parametrize("full", ["every-block", "every-inode"])
def test_reindex_and_a_supervisor_start_on_a_full_disk_refuse_changing_nothing(disk: LoopFs, full: str, command: list[str]) -> None:
    """``store reindex`` (which rewrites every index) and a supervisor's start (``demo``: its owner
    record comes first) on a disk with no room: ``DURABILITY_FAILED``, exit 2, no traceback, and not
    one file of the store changed; listings still read."""
    st = store.Store(str(disk.mount / "store"), durability="batched")
    old_subtrees(st, roots=2, children=2)
    before = snapshot(st.root)
    if full == "every-block":
        fill(disk.mount)
    else:
        take_every_inode(disk.mount)
    cli = [sys.executable, "-m", "subagents.supervisor.cli", "--store", st.root]
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    refused = subprocess.run([*cli, *command], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert refused.stderr.startswith("error: DURABILITY_FAILED: "), refused.stderr
    assert snapshot(st.root) == before
    listed = subprocess.run([*cli, "ls"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and "old0" in listed.stdout and "old1" in listed.stdout, listed.stderr
