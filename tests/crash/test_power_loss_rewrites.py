"""A power loss right after the store rewrote or removed files it already had.

``test_power_loss.py`` covers what the store creates or appends to; this covers what it replaces,
truncates, rewrites in place or deletes: ``migrate`` (from version 1, and from version 3, the
marker alone), ``reindex`` (the indexes it replaces, and one it removes), ``gc``'s trash folders
and the roots index it compacts, the torn tail of a log and of a mailbox cut when they are opened
again (and by ``fsck --repair``), the lease rewritten in place, and a rolled-back child. Each test does the operation, then reads the device as a machine that
lost power right after it returned would (the harness of ``_power_loss.py``): as it is, and after
the boot's check.

That check is ``e2fsck -p``, the boot's, and it passes alone after every operation here: a file
created, appended to, truncated or written in place; a file replaced by a rename or unlinked;
and folders deleted with everything in them (``migrate`` from version 1, ``gc``'s trash
folders), because the store writes each inode it frees as deleted (every removed file and folder
held open until its folder's fsync, then fsync'd: ``atomic.Removal``). Without that, on an ext4
without a journal, the removal of a name reaches the disk with its folder's fsync while the
inode it named stays written as in use, and preen mode stops at an "unattached inode" or an
"unconnected directory" for an operator (what these tests found before).

A removal is also made durable before the inode it freed can be reused (``remove_durably``):
otherwise a power loss after another file took that inode brings the old name back naming it.
Some tests make such files (``other_files``, or the next sessions) before the power loss.

``migrate`` is also cut at each of its steps (killed there, then the power lost) and must be
finished by the next run, on the checked file system, to the very bytes of an uninterrupted run.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from subagents import store
from subagents.store.atomic import remove_durably
from subagents.store.framing import encode_record, scan
from subagents.store.fsck import fsck as store_fsck
from subagents.store.lease import host_identity
from subagents.store.migrate import migrate
from subagents.store.session_file import SessionFile

from tests.store._v1_store import build_sample, snapshot, v3_store

from ._power_loss import LoopFs, after_power_loss, problems, run, seen
from .test_migrate_crash import migrated_sample, run_killed

SAMPLE = ("c1", "c2", "c3", "r1", "r2")


def collected_old_tree(disk: LoopFs) -> store.Store:
    """A store on ``disk`` with two trees, ``old`` and ``kept`` (3 children each), on the device;
    then a gc that collects ``old`` (an hour old) and returns. The store."""
    st = store.Store(str(disk.mount / "store"))
    for root in ("old", "kept"):
        store.create_session(st, root)
        for i in range(3):
            store.create_session(st, f"{root}{i}", parent_session=root)
    hour_ago = time.time() - 3600
    for session_id in ("old", "old0", "old1", "old2"):
        os.utime(st.session_path(session_id), (hour_ago, hour_ago))
    run("sync", "-f", str(disk.mount))
    assert [c.id for c in store.collect(st, 600.0).collected] == ["old"]
    return st


def reading(st: store.Store, session_ids: tuple[str, ...]) -> dict[str, Any]:
    """What the store's readers say of ``session_ids``: to compare a store with itself after a power loss."""
    found: dict[str, Any] = {"ids": st.session_ids(), "roots": [r.id for r in store.list_roots(st)]}
    for sid in session_ids:
        seen_now = store.inspect(st, sid, locked=True)
        lease = store.read_lease(st, sid)
        found[sid] = {
            "status": seen_now.status, "events": seen_now.events,
            "lease": None if lease is None else (lease.owner, lease.epoch, lease.state),
            "mailbox": [m.id for m in store.read_mailbox(st, sid, locked=True)],
            "control": [c.id for c in store.read_controls(st, sid)],
            "children": [(c.id, c.status) for c in store.list_children(st, sid)],
        }
    return found


def names(root: Path) -> list[str]:
    """Every path under ``root``, with each file's size (``name:0`` for an empty one)."""
    out = []
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            out.append(rel if name in dirs else f"{rel}:{os.path.getsize(path)}")
    return sorted(out)


def log_end(st: store.Store, sid: str) -> tuple[int, int]:
    """(the offset in the session's file where its log's records end, the next seq)."""
    with SessionFile.open(sid, st.session_path(sid)) as file:
        result = scan(file.read_log(), padded=True)
        return file.data_start + result.end, len(result.records)


# -- migrate ------------------------------------------------------------------------------


def test_a_store_migrated_from_version_1_reads_whole_after_a_power_loss(disk: LoopFs):
    """Every session, with its events, lease, mailbox, control requests and children, reads as it did
    when ``migrate`` returned, from files of the same names and sizes (none empty, no folder set aside
    or temporary file left), and the trash entry of the unfinished gc holds its converted ``session``
    and none of the version-1 files it dropped."""
    root = disk.mount / "store"
    build_sample(root)
    run("sync", "-f", str(disk.mount))  # the old store is on the device; the conversion is what is tested
    migrate(root)
    expected = reading(store.Store(root, create=False), SAMPLE)
    files = names(root)
    for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
        with after_power_loss(disk, name, fsck) as mount:
            assert names(mount / "store") == files, name
            assert reading(seen(mount), SAMPLE) == expected, name
            with SessionFile.open("t1", str(mount / "store" / "trash" / "t1.0badcafe" / "session")) as file:
                assert file.header_map["id"] == "t1"


def test_a_store_migrated_from_version_3_reads_whole_after_a_power_loss(disk: LoopFs):
    """The lock files beside the indexes are gone and the marker is the new one."""
    root = disk.mount / "store"
    v3_store(root)
    run("sync", "-f", str(disk.mount))
    migrate(root)
    expected = reading(store.Store(root, create=False), SAMPLE)
    files = names(root)
    for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
        with after_power_loss(disk, name, fsck) as mount:
            assert names(mount / "store") == files, name
            assert reading(seen(mount), SAMPLE) == expected, name


def test_a_power_loss_at_any_step_of_migrate_leaves_a_store_the_next_run_finishes(disk: LoopFs, tmp_path: Path):
    """One copy of the version-1 store per step, all on one file system; each copy's ``migrate`` is
    killed right after its step N, one after the other, and the power is lost once, after the last.
    What the kills left in memory and never wrote is lost, as a machine that lost power within the
    writeback delay loses it, and the conversions that ran after a kill reused the inodes it had
    freed, as any process on the file system may. The boot's ``e2fsck -p`` passes alone (each step
    ends once what it removed is written as deleted), each copy is refused (naming ``migrate``)
    until its run is finished, and a run finishes it to the bytes an uninterrupted run writes."""
    template, steps, expected = migrated_sample(tmp_path)
    jobs = []
    for n in range(1, steps + 1):
        jobs.append((disk.mount / f"k{n}", n))
        shutil.copytree(template, jobs[-1][0])
    run("sync", "-f", str(disk.mount))
    died = run_killed(jobs)
    assert set(died.values()) == {signal.SIGKILL}
    wrong = {}
    with after_power_loss(disk, "killed.img", "-p", writable=True) as mount:
        for _, n in jobs:
            path = mount / f"k{n}"
            if n < steps:
                with pytest.raises(store.StoreFormatError) as caught:
                    store.Store(path, create=False)
                assert "subagents store migrate" in caught.value.message, n
            migrate(path, durability="none")  # what it finishes is checked, not its own fsyncs (slow on a loop device)
            found = snapshot(path)
            if found != expected:
                wrong[n] = sorted(set(found.items()) ^ set(expected.items()))
    assert not wrong, "\n".join(f"{n}: {[(k, (v or b'')[:40]) for k, v in d]}" for n, d in wrong.items())


# -- reindex and the roots index -------------------------------------------------------------


def corrupt_record(path: Path, index: int) -> None:
    """Flip a payload byte of the ``index``-th record of a framed file: its CRC no longer matches."""
    data = bytearray(path.read_bytes())
    offset = 0
    for _ in range(index):
        offset += 8 + int.from_bytes(data[offset:offset + 4], "little")
    data[offset + 9] ^= 0xFF
    with open(path, "r+b") as handle:
        handle.write(bytes(data))
        handle.flush()
        os.fsync(handle.fileno())


def test_a_reindex_before_a_power_loss_lists_every_child_after_it(disk: LoopFs):
    """A record of a children index and one of the roots index damaged (readers skip them), then
    ``store reindex``: the rebuilt files, not the damaged ones, are on the device."""
    st = store.Store(str(disk.mount / "store"))
    children = {"p": ["c0", "c1", "c2"], "q": ["d0"]}
    for parent, kids in children.items():
        store.create_session(st, parent)
        for kid in kids:
            store.create_session(st, kid, parent_session=parent)
    corrupt_record(disk.mount / "store" / "index" / "children" / "p", 1)  # c1's entry: skipped by readers
    corrupt_record(disk.mount / "store" / "index" / "roots", 0)  # p's
    run("sync", "-f", str(disk.mount))
    assert [e.id for e in store.read_children(st, "p")] == ["c0", "c2"]
    store.reindex(st)
    store.rebuild_roots(st)
    for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
        with after_power_loss(disk, name, fsck) as mount:
            found = seen(mount)
            for parent, kids in children.items():
                assert [e.id for e in store.read_children(found, parent)] == kids, (name, parent)
                assert store.read_index(found, parent).problems == [], name
            assert sorted(r.id for r in store.list_roots(found)) == ["p", "q"], name


def test_gc_rewrites_the_roots_index_before_a_power_loss_and_it_lists_the_kept_roots_after_it(disk: LoopFs):
    """gc's last step replaces ``index/roots`` without its tombstones: the compacted file is the one on
    the device (``test_power_loss.py`` checks the sessions gc kept and removed)."""
    st = store.Store(str(disk.mount / "store"))
    for root in ("old", "kept"):
        store.create_session(st, root)
        store.create_session(st, f"{root}1", parent_session=root)
    hour_ago = time.time() - 3600
    for session_id in ("old", "old1"):
        os.utime(st.session_path(session_id), (hour_ago, hour_ago))
    run("sync", "-f", str(disk.mount))
    assert [c.id for c in store.collect(st, 600.0).collected] == ["old"]
    compacted = (disk.mount / "store" / "index" / "roots").read_bytes()
    for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
        with after_power_loss(disk, name, fsck) as mount:
            assert (mount / "store" / "index" / "roots").read_bytes() == compacted, name
            assert [r.id for r in store.list_roots(seen(mount))] == ["kept"], name


# -- torn tails cut when reopened ------------------------------------------------------------


def test_a_log_whose_torn_tail_was_cut_keeps_the_turn_written_after_it(disk: LoopFs):
    """A partial record in the padding after a committed turn (a write that never returned), cut by
    ``LogWriter.open`` (a truncation), then a turn committed over the same bytes: the log is clean
    and holds both turns."""
    st = store.Store(str(disk.mount / "store"))
    store.create_session(st, "s")
    with store.LogWriter.open(st, "s", epoch=0) as writer:
        writer.append([("turn/start", {}), ("turn/end", {"stop_reason": "completed"})], commit=True)
    at, seq = log_end(st, "s")
    torn = encode_record({"seq": seq, "ts": 1.0, "type": "assistant/message", "data": {"text": "y" * 300}, "epoch": 0})[:120]
    fd = os.open(st.session_path("s"), os.O_WRONLY)
    try:
        os.pwrite(fd, torn, at)
    finally:
        os.close(fd)
    run("sync", "-f", str(disk.mount))
    assert store.inspect(st, "s").status == "torn"
    with store.LogWriter.open(st, "s", epoch=0) as writer:
        writer.append([("turn/start", {}), ("assistant/message", {"text": "z" * 50}), ("turn/end", {"stop_reason": "completed"})],
                      commit=True)
    expected = store.inspect(st, "s").events
    assert len(expected) == 5
    for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
        with after_power_loss(disk, name, fsck) as mount:
            found = store.inspect(seen(mount), "s", locked=True)
            assert (found.status, found.events) == ("clean", expected), name


def test_fsck_repair_of_a_torn_tail_is_durable(disk: LoopFs):
    """``store fsck --repair`` cuts a torn tail that closes no turn: the cut itself is what it did, and it
    is fsync'd (``LogWriter.open`` commits after a truncation), so the torn bytes do not come back."""
    st = store.Store(str(disk.mount / "store"))
    store.create_session(st, "s")
    with store.LogWriter.open(st, "s", epoch=0) as writer:
        writer.append([("turn/start", {}), ("turn/end", {"stop_reason": "completed"})], commit=True)
    at, seq = log_end(st, "s")
    fd = os.open(st.session_path("s"), os.O_WRONLY)
    try:
        os.pwrite(fd, encode_record({"seq": seq, "ts": 1.0, "type": "turn/start", "data": {}, "epoch": 0})[:11], at)
    finally:
        os.close(fd)
    run("sync", "-f", str(disk.mount))
    report = store_fsck(st, repair=True, lease_ttl_s=10.0)
    assert report["counts"]["torn"] == 1, report
    expected = store.inspect(st, "s")
    assert expected.status == "clean"
    for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
        with after_power_loss(disk, name, fsck) as mount:
            found = store.inspect(seen(mount), "s", locked=True)
            assert (found.status, found.events, found.size) == ("clean", expected.events, expected.size), name


def test_a_mailbox_whose_torn_tail_was_cut_keeps_every_acceptance(disk: LoopFs):
    """The next acceptance cuts a torn acceptance (a truncation) and writes over it: every message
    accepted, before and after the cut, reads."""
    st = store.Store(str(disk.mount / "store"))
    store.create_session(st, "s")
    ids = store.IdGenerator()
    accepted = [store.accept(st, "s", source={"kind": "user"}, content=f"m{i}", ids=ids) for i in range(2)]
    mailbox = st.path("s", "mailbox")
    data = Path(mailbox).read_bytes()
    end = scan(data, padded=True).end
    torn = encode_record({"seq": 2, "id": "x" * 26, "ts": 1.0, "source": {"kind": "user"}, "content": "cut", "wake": True})[:30]
    fd = os.open(mailbox, os.O_WRONLY)
    try:
        os.pwrite(fd, torn, end)
    finally:
        os.close(fd)
    run("sync", "-f", str(disk.mount))
    accepted.append(store.accept(st, "s", source={"kind": "user"}, content="after the cut", ids=ids))
    for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
        with after_power_loss(disk, name, fsck) as mount:
            assert [m.id for m in store.read_mailbox(seen(mount), "s", locked=True)] == accepted, name


# -- the lease, rewritten in place ------------------------------------------------------------


def test_the_lease_epoch_on_disk_is_the_last_acquisition_that_returned(disk: LoopFs):
    """Acquire, set idle, release (neither fsync'd), acquire again, then a takeover: the lease on the
    device is the takeover's, at its epoch, never an earlier one."""
    st = store.Store(str(disk.mount / "store"))
    store.create_session(st, "s")
    run("sync", "-f", str(disk.mount))
    first = store.acquire_lease(st, "s", "ownerA")  # ownerA has no record: dead to every other owner
    store.set_lease_state(st, "s", "ownerA", first.epoch, "idle")
    store.release_lease(st, "s", "ownerA", first.epoch)
    again = store.acquire_lease(st, "s", "ownerA")
    taken = store.acquire_lease(st, "s", "ownerB")  # a takeover: ownerA is dead
    assert (first.epoch, again.epoch, taken.epoch) == (1, 2, 3)
    for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
        with after_power_loss(disk, name, fsck) as mount:
            lease = store.read_lease(seen(mount), "s")
            assert (lease.owner, lease.epoch, lease.state) == ("ownerB", 3, "running"), name


def test_a_release_lost_in_a_power_loss_reads_as_held_only_until_its_owner_is_dead(disk: LoopFs):
    """A release is not fsync'd (FORMAT.md §7): the power loss may bring back the acquisition it
    replaced. What is promised is that the epoch stays, and that such a lease holds nobody off for
    good: its owner's record, as it reached the device or not at all, is dead once its heartbeat is
    ``ttl`` old on the rebooted host (the process that wrote it is gone with the power)."""
    st = store.Store(str(disk.mount / "store"))
    store.create_session(st, "s")
    owner = store.register_owner(st, "ownerA", ttl=30.0)
    run("sync", "-f", str(disk.mount))
    lease = store.acquire_lease(st, "s", "ownerA")
    store.release_lease(st, "s", "ownerA", lease.epoch)
    rebooted_host = host_identity().rpartition("/")[0] + "/another-boot"
    for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
        with after_power_loss(disk, name, fsck) as mount:
            found = seen(mount)
            after = store.read_lease(found, "s")
            assert (after.owner, after.epoch) == ("ownerA", 1), name
            if after.state != "released":
                record = store.read_owner(found, "ownerA")
                assert record == owner or record is None, name
                assert not store.owner_alive(record, now=owner.heartbeat_at + 31.0, host=rebooted_host), name


# -- removals ---------------------------------------------------------------------------------


def other_files(disk: LoopFs, count: int) -> None:
    """Files made and fsync'd on the same file system by someone else (another store): they take the
    inodes the store just freed, as any process writing there may."""
    other = store.Store(str(disk.mount / "other"))
    for i in range(count):
        store.create_session(other, f"o{i}")


def test_a_rolled_back_child_is_gone_after_a_power_loss(disk: LoopFs):
    """``delete_session`` (a creation rolled back) unlinks the session's file and appends a durable
    tombstone. Then other files take the freed inode. After the power loss the child is neither
    listed nor present: its name does not come back, least of all naming someone else's file
    (a folder or a file in a session's place reads as a damaged session, which holds ``gc`` back)."""
    st = store.Store(str(disk.mount / "store"))
    store.create_session(st, "p")
    store.create_session(st, "c", parent_session="p")
    store.create_session(st, "d", parent_session="p")
    run("sync", "-f", str(disk.mount))
    store.delete_session(st, "c", parent_session="p")
    other_files(disk, 4)
    for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
        with after_power_loss(disk, name, fsck) as mount:
            found = seen(mount)
            assert [e.id for e in store.read_children(found, "p")] == ["d"], name
            assert found.session_ids() == ["d", "p"] and not found.exists("c"), name


def test_a_gc_before_a_power_loss_leaves_no_trash_naming_a_file_made_after_it(disk: LoopFs):
    """gc deletes its trash folders last; new sessions made right after take the inodes it freed.
    After the power loss ``trash/`` holds nothing a later gc would read (a folder name there that
    names a new session's file made the next gc fail, ``NotADirectoryError``, on every run), and
    the next gc runs and keeps every session."""
    st = collected_old_tree(disk)
    made = ["new"] + [f"new{i}" for i in range(6)]
    store.create_session(st, "new")
    for sid in made[1:]:
        store.create_session(st, sid, parent_session="new")
    kept = made + ["kept", "kept0", "kept1", "kept2"]
    with after_power_loss(disk, "as-is.img") as mount:
        assert sorted(os.listdir(mount / "store" / "trash")) == [".lock", ".reserve"]
        assert problems(seen(mount), kept) == {}
    with after_power_loss(disk, "checked.img", "-p", writable=True) as mount:
        assert sorted(os.listdir(mount / "store" / "trash")) == [".lock", ".reserve"]
        found = store.Store(str(mount / "store"), create=False)
        report = store.collect(found, 600.0)
        assert (report.collected, report.finished) == ((), 0), report
        assert problems(found, kept) == {}
        assert sorted(found.session_ids()) == sorted(kept)


def test_a_gc_before_a_power_loss_leaves_no_index_of_a_collected_parent_naming_a_new_session(disk: LoopFs):
    """gc drops the children index of each collected parent (``drop_index``); a session created
    right after, in ``sessions/``, takes the inode the index freed (nothing else fsyncs
    ``index/children/`` meanwhile). After the power loss, as the device holds it and after the
    boot's ``e2fsck -p``, the collected parent has no index: not its old one back, least of all a
    name for the new session's file (which ``read_children`` would read as an index, and an append
    for a parent of that id would write into)."""
    st = collected_old_tree(disk)
    made = [f"new{i}" for i in range(6)]
    for sid in made:  # children of a parent whose index exists: no new file in index/children/
        store.create_session(st, sid, parent_session="kept")
    kept = ["kept", "kept0", "kept1", "kept2", *made]
    for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
        with after_power_loss(disk, name, fsck) as mount:
            found = seen(mount)
            assert not os.path.lexists(found.children_index_path("old")), name
            assert problems(found, kept) == {}, name
            assert [e.id for e in store.read_children(found, "kept")] == kept[1:], name


def test_a_creation_that_cleared_a_former_sessions_companions_leaves_them_deleted_after_a_power_loss(disk: LoopFs):
    """A gc killed between moving a session's file and its companions leaves the companions in
    ``sessions/``; creating a session of that id again removes them (``_clear_companions``). After
    the power loss the new session reads with no mail, the old mailbox's name does not come back,
    and the boot's ``e2fsck -p`` passes alone: an inode still written as in use that no folder
    names stops it for an operator. Files made after the mailbox (``filler``) keep any inode
    written after the removal from sharing its inode-table block, which would write it as
    deleted by chance. (The name itself cannot come back naming another file once the creation
    returned: the creation's fsync of ``sessions/`` follows the removal.)"""
    st = store.Store(str(disk.mount / "store"))
    store.create_session(st, "c")
    ids = store.IdGenerator()
    for i in range(3):
        store.accept(st, "c", source={"kind": "user"}, content="m" * 3000 + str(i), ids=ids)
    (disk.mount / "filler").mkdir()
    for i in range(32):
        (disk.mount / "filler" / str(i)).write_bytes(b"f")
    os.rename(st.session_path("c"), disk.mount / "filler" / "moved")  # what the killed gc moved into its trash
    assert os.path.getsize(st.path("c", "mailbox")) > 0
    run("sync", "-f", str(disk.mount))
    store.create_session(st, "c")
    for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
        with after_power_loss(disk, name, fsck) as mount:
            found = seen(mount)
            assert not os.path.lexists(found.path("c", "mailbox")), name
            assert problems(found, ["c"]) == {}, name
            assert store.read_mailbox(found, "c", locked=True) == [], name


def test_a_folder_of_many_files_removed_before_a_power_loss_is_gone_and_deleted(disk: LoopFs):
    """``remove_durably`` of a folder holding more files than it holds open at once, and a folder
    inside it: the removal is settled as it goes. Other files then take the freed inodes. After
    the power loss the folder is gone and the boot's ``e2fsck -p`` passes alone."""
    top = disk.mount / "big"
    (top / "inner").mkdir(parents=True)
    for i in range(150):
        (top / ("inner" if i % 3 == 0 else ".") / f"f{i}").write_bytes(b"x" * 2000)
    run("sync", "-f", str(disk.mount))
    assert remove_durably([str(top)], durable=True) == 1
    other_files(disk, 4)
    for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
        with after_power_loss(disk, name, fsck) as mount:
            assert not os.path.lexists(mount / "big"), name


def test_a_reindex_that_removed_an_index_before_a_power_loss_lets_its_parent_list_children_again(disk: LoopFs):
    """``reindex`` removes the index of a parent its headers leave without children (here the child's
    file was lost). Other files take the freed inode. After the power loss the parent's index is
    absent, not a name for someone else's file: a new child is created and listed."""
    st = store.Store(str(disk.mount / "store"))
    store.create_session(st, "p")
    store.create_session(st, "c", parent_session="p")
    os.unlink(st.session_path("c"))
    run("sync", "-f", str(disk.mount))
    store.reindex(st)
    assert not os.path.lexists(st.children_index_path("p"))
    other_files(disk, 4)
    with after_power_loss(disk, "as-is.img") as mount:
        assert not os.path.lexists(seen(mount).children_index_path("p"))
    with after_power_loss(disk, "checked.img", "-p", writable=True) as mount:
        found = store.Store(str(mount / "store"), create=False)
        assert not os.path.lexists(found.children_index_path("p"))
        store.create_session(found, "e", parent_session="p")
        assert [e.id for e in store.read_children(found, "p")] == ["e"]
