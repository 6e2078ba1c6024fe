"""``atomic.Removal`` (``remove_durably``): what it fsyncs, in which order, and what it holds open.

The power-loss tests (``tests/crash/test_power_loss_rewrites.py``) show what a power loss leaves;
these pin the steps that make it so, on any file system: every removed file and folder, inside
a removed folder too, is fsync'd once after the folder that named it, and no more than
``_HELD_AT_ONCE`` removed inodes are held open at once.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from subagents.store import atomic
from subagents.store.atomic import Removal, remove_durably


def tree(base: Path) -> dict[int, int]:
    """trash/{t1/{a,b,c}, t2/{d, sub/{e}}}; each removed inode → the inode of the folder naming it."""
    (base / "trash" / "t1").mkdir(parents=True)
    (base / "trash" / "t2" / "sub").mkdir(parents=True)
    for rel in ("t1/a", "t1/b", "t1/c", "t2/d", "t2/sub/e"):
        (base / "trash" / rel).write_bytes(b"x" * 100)
    named_in = {}
    for folder, dirs, files in os.walk(base / "trash"):
        for name in dirs + files:
            named_in[os.lstat(os.path.join(folder, name)).st_ino] = os.lstat(folder).st_ino
    return named_in


def spy_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The inode of each fsync'd descriptor, in order."""
    synced: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    return synced


def test_every_removed_inode_is_fsynced_once_after_the_folder_that_named_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    named_in = tree(tmp_path)
    trash = os.lstat(tmp_path / "trash").st_ino
    synced = spy_fsyncs(monkeypatch)
    assert remove_durably([str(tmp_path / "trash" / "t1"), str(tmp_path / "trash" / "t2")], durable=True) == 2
    assert os.listdir(tmp_path / "trash") == []
    assert synced.count(trash) == 1 and sorted(set(synced) - {trash}) == sorted(named_in)
    assert len(synced) == len(named_in) + 1, "each removed inode once"
    for ino, folder in named_in.items():
        assert synced.index(folder) < synced.index(ino)


def test_a_removal_that_is_not_durable_fsyncs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    tree(tmp_path)
    synced = spy_fsyncs(monkeypatch)
    assert remove_durably([str(tmp_path / "trash"), str(tmp_path / "gone")], durable=False) == 1
    assert synced == [] and os.listdir(tmp_path) == []


def test_a_folder_of_more_files_than_it_holds_is_settled_as_it_goes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The descriptors held stay under ``_HELD_AT_ONCE`` (plus the folders being walked); the
    folder still there is fsync'd, with the names it lost, before the files it named."""
    big = tmp_path / "big"
    big.mkdir()
    count = atomic._HELD_AT_ONCE * 3 + 5
    for i in range(count):
        (big / str(i)).write_bytes(b"x")
    big_ino = os.lstat(big).st_ino
    before = len(os.listdir("/proc/self/fd"))
    held: list[int] = []
    synced = spy_fsyncs(monkeypatch)
    real_sync = atomic._sync_unlinked

    def counting(fd: int) -> None:
        held.append(len(os.listdir("/proc/self/fd")))
        real_sync(fd)

    monkeypatch.setattr(atomic, "_sync_unlinked", counting)
    assert remove_durably([str(big)], durable=True) == 1
    assert not big.exists() and len(held) == count + 1
    assert max(held) - before <= atomic._HELD_AT_ONCE + 2  # + the folder walked, + listdir's own
    assert len(synced) == count + 1 + 4, "each file, the folder as deleted, then the folder in each of 3 settles and tmp_path once"
    assert synced[0] == big_ino and synced[-7:-5] == [os.lstat(tmp_path).st_ino, big_ino]


def test_links_and_fifos_in_a_removed_folder_are_removed_never_followed(tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"k")
    gone = tmp_path / "gone"
    gone.mkdir()
    (gone / "to-folder").symlink_to(outside)
    (gone / "to-file").symlink_to(outside / "keep")
    os.mkfifo(gone / "fifo")
    (tmp_path / "link-to-folder").symlink_to(outside)
    assert remove_durably([str(gone), str(tmp_path / "link-to-folder")], durable=True) == 2
    assert sorted(os.listdir(tmp_path)) == ["outside"] and os.listdir(outside) == ["keep"]


def test_what_a_failed_removal_took_away_still_settles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A file inside the folder that cannot be removed: the folder stays with it, the files removed
    before it are held and fsync'd after the folder (``ignore_errors``), or the error is raised."""
    for ignore in (True, False):
        folder = tmp_path / f"f{ignore}"
        folder.mkdir()
        for name in ("a", "b", "stuck"):
            (folder / name).write_bytes(b"x")
        removed = [os.lstat(folder / name).st_ino for name in ("a", "b")]
        real_unlink = os.unlink

        def unlink(path, *, dir_fd=None):
            if os.path.basename(path) == "stuck":
                raise PermissionError(1, "refused")
            return real_unlink(path, dir_fd=dir_fd)

        monkeypatch.setattr(atomic.os, "unlink", unlink)
        real_listdir = os.listdir
        monkeypatch.setattr(atomic.os, "listdir", lambda fd: sorted(real_listdir(fd)))  # a, b, then stuck
        synced = spy_fsyncs(monkeypatch)
        if ignore:
            assert remove_durably([str(folder)], durable=True, ignore_errors=True) == 0
        else:
            with pytest.raises(PermissionError):
                with Removal(durable=True) as removal:
                    removal.remove(str(folder))
        monkeypatch.undo()
        assert os.listdir(folder) == ["stuck"]
        if ignore:
            assert synced == [os.lstat(folder).st_ino, *removed]
        else:
            assert synced == []  # an error raised out of the block: nothing settled, every hold let go


def test_a_folder_named_with_a_trailing_slash_has_its_parent_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``trash/t1/``: the folder that loses the name is ``trash``, not ``trash/t1`` (gone by then,
    so its removal would never be made durable)."""
    tree(tmp_path)
    t1 = os.lstat(tmp_path / "trash" / "t1").st_ino
    synced = spy_fsyncs(monkeypatch)
    assert remove_durably([str(tmp_path / "trash" / "t1") + os.sep], durable=True) == 1
    assert synced[:2] == [os.lstat(tmp_path / "trash").st_ino, t1] and len(synced) == 5  # then a, b, c


def fail_fsync_of(monkeypatch: pytest.MonkeyPatch, inodes: set[int]) -> list[int]:
    """``os.fsync`` fails with EIO for a descriptor of one of ``inodes``; the failed inodes, in order."""
    failed: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        inode = os.fstat(fd).st_ino
        if inode in inodes:
            failed.append(inode)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return failed


def test_a_failed_fsync_of_a_replaced_file_leaves_the_write_done(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture):
    """The new bytes are durable (written, fsync'd, renamed, folder fsync'd) before the replaced
    inode is written as deleted, which only spares the boot's ``e2fsck -p`` a question: its failure
    is logged, and the write is not reported failed (its caller would undo or retry work that is done)."""
    path = tmp_path / "index"
    path.write_bytes(b"old")
    failed = fail_fsync_of(monkeypatch, {os.lstat(path).st_ino})
    with caplog.at_level(logging.WARNING, logger="subagents.store.atomic"):
        atomic.write_atomic(str(path), b"new", durable=True)
    assert path.read_bytes() == b"new"
    assert len(failed) == 1
    assert "written as deleted" in caplog.text


def test_a_failed_fsync_of_a_removed_file_leaves_the_removal_done(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture):
    named_in = tree(tmp_path)
    removed_files = {ino for ino in named_in if ino not in set(named_in.values())}
    failed = fail_fsync_of(monkeypatch, removed_files)
    with caplog.at_level(logging.WARNING, logger="subagents.store.atomic"):
        assert remove_durably([str(tmp_path / "trash" / "t1"), str(tmp_path / "trash" / "t2")], durable=True) == 2
    assert os.listdir(tmp_path / "trash") == []
    assert sorted(failed) == sorted(removed_files)
    assert "written as deleted" in caplog.text


def test_a_failed_fsync_of_a_folder_that_lost_a_name_fails_the_removal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """That fsync is what makes the removal durable: its failure is the removal's."""
    tree(tmp_path)
    fail_fsync_of(monkeypatch, {os.lstat(tmp_path / "trash").st_ino})
    with pytest.raises(atomic.DurabilityError):
        remove_durably([str(tmp_path / "trash" / "t1")], durable=True)
