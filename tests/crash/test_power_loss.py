"""A power loss right after creations returned: every created session is still there, and reads.

A ``kill -9`` leaves the page cache, so it never tests what reached the disk. This does: the store
lives on an ext4 file system without a journal (as on the machine CI runs on) in a file attached
as a loop device; right after the creations return, the file is copied — the copy holds exactly
what the file system had written to its device, which is what a machine that lost power would
find. The copy is then attached (read-only) as a second file system and read with the store's own
readers, as it is (a host that reboots without a check) and after ``e2fsck -p`` (the check a boot runs
on a file system that was not cleanly unmounted).

The defect this found: a session file is written as an unnamed file (``O_TMPFILE``) and named with
``linkat``. It was fsync'd *before* the link, which wrote its inode with a link count of 0; the
link's new count stayed in memory, and the folder's fsync writes the folder, not the file's inode.
Without a journal nothing else wrote that inode, so after the power loss the last sessions created
had a name that pointed at a deleted inode (``e2fsck`` clears the name; the kernel refuses to open
it). The fsync now follows the link, and writes the inode with its count.

The harness (``after_power_loss``; the ``disk`` fixture, in ``conftest.py``) is in ``_power_loss.py``; it skips without
root and loop devices.
"""

from __future__ import annotations

import os
import time

from subagents import store
from subagents.store.concurrent_sync import ConcurrentSync
from subagents.store.session import NewSession, commit_sessions, create_sessions, publish_sessions

from ._power_loss import LoopFs, after_power_loss, problems, run, seen


def test_sessions_created_before_a_power_loss_are_all_there(disk: LoopFs):
    st = store.Store(str(disk.mount / "store"))
    store.create_session(st, "root")
    run("sync", "-f", str(disk.mount))  # the store and its root are on the device before the creations
    created = ["alone"]
    store.create_session(st, "alone", parent_session="root")
    batch = [NewSession(f"b{i}", parent_session="root") for i in range(5)]
    outcomes = create_sessions(st, batch)
    assert not [o for o in outcomes if isinstance(o, BaseException)]
    created += [request.session_id for request in batch]
    store.create_session(st, "last", parent_session="root")
    created.append("last")

    for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
        with after_power_loss(disk, name, fsck) as mount:
            assert problems(seen(mount), created) == {}, name


def test_a_batch_whose_fsyncs_ran_at_once_is_all_there_after_a_power_loss(disk: LoopFs):
    """The supervisor's batches fsync their files at once (``ConcurrentSync``): each after its link,
    all before the folder's fsync and the index append, so a batch that returned is whole after it."""
    st = store.Store(str(disk.mount / "store"))
    store.create_session(st, "root")
    run("sync", "-f", str(disk.mount))
    batch = [NewSession(f"b{i}", parent_session="root") for i in range(12)]
    syncs = ConcurrentSync()
    try:
        outcomes = commit_sessions(st, batch, publish_sessions(st, batch, syncs=syncs))
    finally:
        syncs.close()
    assert not [o for o in outcomes if isinstance(o, BaseException)]

    for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
        with after_power_loss(disk, name, fsck) as mount:
            assert problems(seen(mount), [r.session_id for r in batch]) == {}, name


def test_acceptances_and_committed_turns_before_a_power_loss_are_all_there(disk: LoopFs):
    """A message ``accept`` returned (its mailbox made by the first) and a turn whose commit
    returned, in a session created before, survive the power loss: as the device holds them and
    after ``e2fsck -p``."""
    st = store.Store(str(disk.mount / "store"))
    store.create_session(st, "root")
    store.create_session(st, "c", parent_session="root")
    run("sync", "-f", str(disk.mount))
    ids = store.IdGenerator()
    accepted = [store.accept(st, "c", source={"kind": "user"}, content=f"m{i}", ids=ids) for i in range(3)]
    with store.LogWriter.open(st, "c", epoch=0) as writer:
        writer.append([("turn/start", {}), ("assistant/message", {"text": "x" * 6000}), ("turn/end", {"stop_reason": "completed"})],
                      commit=True)
    store.create_session(st, "d", parent_session="root")

    for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
        with after_power_loss(disk, name, fsck) as mount:
            found_store = seen(mount)
            assert [m.id for m in store.read_mailbox(found_store, "c", locked=True)] == accepted, name
            found = store.inspect(found_store, "c", locked=True)
            assert found.status == "clean" and found.events[-1]["type"] == "turn/end", name
            assert problems(found_store, ["d"]) == {}, name


def test_a_store_made_just_before_a_power_loss_is_whole_after_it(disk: LoopFs):
    """A store made (folders and marker) under a folder made for it, with a session, and no sync
    of anything else: the boot's ``e2fsck -p`` finds nothing it must ask about (a folder whose first
    block never reached the disk is a 'directory corrupted' it stops at) and the session reads."""
    st = store.Store(str(disk.mount / "deep" / "er" / "store"))
    store.create_session(st, "root")
    store.create_session(st, "c", parent_session="root")
    with after_power_loss(disk, "made.img", "-p") as mount:
        found_store = seen(mount, "deep", "er")
        assert problems(found_store, ["root", "c"]) == {}
        assert [e.id for e in store.read_children(found_store, "root")] == ["c"]


def test_a_gc_just_before_a_power_loss_loses_nothing_it_kept(disk: LoopFs):
    """``gc`` moves each collected session into a trash folder, makes the moves durable (its
    ``sessions/`` and ``trash/`` folders fsync'd), then forgets them. A power loss right after it:
    the boot's ``e2fsck -p`` passes alone, the collected sessions are gone from ``sessions/``, the
    kept root and its children read, and the store opens.

    What ``-p`` found here: the files inside each deleted trash folder, and the folder itself, were
    unlinked without being written as deleted, so their inodes stayed written as in use while no
    folder named them ("Unattached inode", which preen mode leaves to an operator). Every removed
    file and folder is now held open until its folder's fsync, then fsync'd (``atomic.Removal``)."""
    st = store.Store(str(disk.mount / "store"))
    made = {}
    for root in ("old", "kept"):
        store.create_session(st, root)
        made[root] = [root] + [f"{root}{i}" for i in range(3)]
        for child in made[root][1:]:
            store.create_session(st, child, parent_session=root)
    hour_ago = time.time() - 3600
    for session_id in made["old"]:
        os.utime(st.session_path(session_id), (hour_ago, hour_ago))
    run("sync", "-f", str(disk.mount))
    report = store.collect(st, 600.0)
    assert [c.id for c in report.collected] == ["old"], report
    with after_power_loss(disk, "gc.img", "-p") as mount:
        found_store = seen(mount)
        assert [s for s in made["old"] if found_store.exists(s)] == []
        assert problems(found_store, made["kept"]) == {}
        assert [e.id for e in store.read_children(found_store, "kept")] == made["kept"][1:]


def test_an_owner_record_and_the_lease_naming_it_survive_a_power_loss_together(disk: LoopFs):
    """Found by a probe: the owner record was written without an fsync while the leases that name it are
    fsync'd. A power loss in a host's first seconds left ``owners/<id>`` empty beside a lease naming it:
    ``store check`` said ``owner-unreadable`` (it may still run), and neither ``fsck --repair`` nor ``gc``
    would ever free that lease or collect its tree until someone removed the file by hand."""
    st = store.Store(str(disk.mount / "store"))
    store.create_session(st, "root")
    run("sync", "-f", str(disk.mount))
    owner = store.new_id()
    store.register_owner(st, owner, ttl=5.0)
    store.acquire_lease(st, "root", owner)
    for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
        with after_power_loss(disk, name, fsck) as mount:
            found = seen(mount)
            assert store.read_owner(found, owner) is not None, name
            assert store.read_lease(found, "root").owner == owner, name
