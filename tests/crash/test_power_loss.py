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

Needs root, ``losetup``, ``mkfs.ext4``, ``e2fsck`` and a kernel that lets this process mount a loop
device; skipped otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from subagents import store
from subagents.store.session import NewSession, create_sessions

TOOLS = ("losetup", "mkfs.ext4", "e2fsck", "mount", "umount", "sync", "cp")
IMAGE_MB = 16


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60, check=check)


class LoopFs:
    """An ext4 without a journal in ``image``, attached and mounted at ``mount``; ``close`` undoes both."""

    def __init__(self, image: Path, mount: Path, *, read_only: bool = False) -> None:
        self.image, self.mount = image, mount
        mount.mkdir(exist_ok=True)
        args = ["losetup", "-f", "--show"] + (["-r"] if read_only else []) + [str(image)]
        self.device = _run(*args).stdout.strip()
        self.mounted = False
        try:
            _run("mount", "-o", "ro" if read_only else "rw", self.device, str(mount))
            self.mounted = True
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.mounted:
            _run("umount", str(self.mount), check=False)
            self.mounted = False
        _run("losetup", "-d", self.device, check=False)


def _loop_mounts_work() -> str | None:
    """Why this test cannot run here, or ``None`` when it can."""
    if os.geteuid() != 0:
        return "needs root (mount)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)}"
    return None


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[LoopFs]:
    reason = _loop_mounts_work()
    if reason is not None:
        pytest.skip(reason)
    image = tmp_path / "disk.img"
    with open(image, "wb") as handle:
        handle.truncate(IMAGE_MB << 20)
    _run("mkfs.ext4", "-q", "-F", "-O", "^has_journal", str(image))
    try:
        fs = LoopFs(image, tmp_path / "mnt")
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot mount a loop device here: {exc.stderr.strip()}")
    try:
        yield fs
    finally:
        fs.close()


@contextlib.contextmanager
def after_power_loss(fs: LoopFs, name: str, fsck: str | None = None) -> Iterator[Path]:
    """What the device holds now, mounted read-only: a copy of the image taken while the file system
    stays mounted, checked first with ``e2fsck fsck`` when given (which must fix or find nothing:
    exit 0 or 1; 4 is a boot that stops and asks). Yields the copy's mount point."""
    copy = fs.image.with_name(name)
    _run("cp", "--sparse=always", str(fs.image), str(copy))  # only the blocks the file system wrote
    if fsck is not None:
        checked = _run("e2fsck", fsck, str(copy), check=False)
        assert checked.returncode in (0, 1), checked.stdout + checked.stderr
    mounted = LoopFs(copy, fs.image.with_name(f"ro-{name}"), read_only=True)
    try:
        yield mounted.mount
    finally:
        mounted.close()


def _problems(st: store.Store, created: list[str]) -> dict[str, str]:
    """Each created session's problem in ``st`` (none: absent from the result)."""
    problems = {}
    for session_id in created:
        try:
            found = store.inspect(st, session_id, locked=True)  # read-only file system: nobody writes
        except store.SubagentError as exc:
            problems[session_id] = f"{exc.code}: {exc.message}"
            continue
        if found.header.id != session_id or found.status != "clean":
            problems[session_id] = f"{found.header.id} {found.status} {found.damage}"
    return problems


def _seen(mount: Path, *parts: str) -> store.Store:
    return store.Store(str(mount.joinpath(*parts, "store")), create=False)


def test_sessions_created_before_a_power_loss_are_all_there(disk: LoopFs):
    st = store.Store(str(disk.mount / "store"))
    store.create_session(st, "root")
    _run("sync", "-f", str(disk.mount))  # the store and its root are on the device before the creations
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
            assert _problems(_seen(mount), created) == {}, name


def test_acceptances_and_committed_turns_before_a_power_loss_are_all_there(disk: LoopFs):
    """A message ``accept`` returned (its mailbox made by the first) and a turn whose commit
    returned, in a session created before, survive the power loss: as the device holds them and
    after ``e2fsck -p``."""
    st = store.Store(str(disk.mount / "store"))
    store.create_session(st, "root")
    store.create_session(st, "c", parent_session="root")
    _run("sync", "-f", str(disk.mount))
    ids = store.IdGenerator()
    accepted = [store.accept(st, "c", source={"kind": "user"}, content=f"m{i}", ids=ids) for i in range(3)]
    with store.LogWriter.open(st, "c", epoch=0) as writer:
        writer.append([("turn/start", {}), ("assistant/message", {"text": "x" * 6000}), ("turn/end", {"stop_reason": "completed"})],
                      commit=True)
    store.create_session(st, "d", parent_session="root")

    for name, fsck in (("as-is.img", None), ("checked.img", "-p")):
        with after_power_loss(disk, name, fsck) as mount:
            seen = _seen(mount)
            assert [m.id for m in store.read_mailbox(seen, "c", locked=True)] == accepted, name
            found = store.inspect(seen, "c", locked=True)
            assert found.status == "clean" and found.events[-1]["type"] == "turn/end", name
            assert _problems(seen, ["d"]) == {}, name


def test_a_store_made_just_before_a_power_loss_is_whole_after_it(disk: LoopFs):
    """A store made (folders and marker) under a folder made for it, with a session, and no sync
    of anything else: the boot's ``e2fsck -p`` finds nothing it must ask about (a folder whose first
    block never reached the disk is a 'directory corrupted' it stops at) and the session reads."""
    st = store.Store(str(disk.mount / "deep" / "er" / "store"))
    store.create_session(st, "root")
    store.create_session(st, "c", parent_session="root")
    with after_power_loss(disk, "made.img", "-p") as mount:
        seen = _seen(mount, "deep", "er")
        assert _problems(seen, ["root", "c"]) == {}
        assert [e.id for e in store.read_children(seen, "root")] == ["c"]


def test_a_gc_just_before_a_power_loss_loses_nothing_it_kept(disk: LoopFs):
    """``gc`` moves each collected session into a trash folder, makes the moves durable (its
    ``sessions/`` and ``trash/`` folders fsync'd), then forgets them. A power loss right after it:
    once ``e2fsck -fy`` has run, the collected sessions are gone from ``sessions/``, the kept root
    and its children read, and the store opens.

    Not asked of a journal-less file system: that the boot's ``e2fsck -p`` passes alone. Deleting
    files there leaves on-disk states (an inode still in use that no folder names any more, a
    trash folder's block that never reached the disk) that preen mode refuses to fix without an
    operator, whatever the program that deleted them did short of a ``syncfs``."""
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
    _run("sync", "-f", str(disk.mount))
    report = store.collect(st, 600.0)
    assert [c.id for c in report.collected] == ["old"], report
    with after_power_loss(disk, "gc.img", "-fy") as mount:
        seen = _seen(mount)
        assert [s for s in made["old"] if seen.exists(s)] == []
        assert _problems(seen, made["kept"]) == {}
        assert [e.id for e in store.read_children(seen, "kept")] == made["kept"][1:]
