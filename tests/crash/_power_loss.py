"""The power-loss harness: a store on an ext4 without a journal in a loop-attached file, and the
device's contents at an instant, read as a machine that lost power would find them.

A ``kill -9`` leaves the page cache, so it never tests what reached the disk. The ``disk`` fixture
mounts a fresh ext4 made without a journal (as on the machine CI runs on) from a file attached as
a loop device; ``after_power_loss`` copies that file while it stays mounted (the copy holds exactly
what the file system had written to its device) and mounts the copy read-only, optionally after the
``e2fsck`` a boot would run. Needs root, ``losetup``, ``mkfs.ext4``, ``e2fsck`` and a kernel that
lets this process mount a loop device; the fixture skips otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from subagents import store

TOOLS = ("losetup", "mkfs.ext4", "e2fsck", "mount", "umount", "sync", "cp")
IMAGE_MB = 16  # room for a few hundred sessions; a copy of it is one power loss


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60, check=check)


class LoopFs:
    """An ext4 without a journal in ``image``, attached and mounted at ``mount``; ``close`` undoes both."""

    def __init__(self, image: Path, mount: Path, *, read_only: bool = False) -> None:
        self.image, self.mount = image, mount
        mount.mkdir(exist_ok=True)
        args = ["losetup", "-f", "--show"] + (["-r"] if read_only else []) + [str(image)]
        self.device = run(*args).stdout.strip()
        self.mounted = False
        try:
            run("mount", "-o", "ro" if read_only else "rw", self.device, str(mount))
            self.mounted = True
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Unmount and detach. A mount still in use (a process the test started holds a file open in it)
        is detached lazily: a plain ``umount`` refused it, unchecked, and the mount and its loop device
        outlived the test run."""
        if self.mounted:
            if run("umount", str(self.mount), check=False).returncode != 0:
                run("umount", "-l", str(self.mount), check=False)
            self.mounted = False
        run("losetup", "-d", self.device, check=False)


def _loop_mounts_work() -> str | None:
    """Why this test cannot run here, or ``None`` when it can."""
    if os.geteuid() != 0:
        return "needs root (mount)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)}"
    return None


@contextlib.contextmanager
def journal_less_disk(tmp_path: Path) -> Iterator[LoopFs]:
    """A fresh ext4 without a journal, mounted under ``tmp_path`` (the ``disk`` fixture of
    ``conftest.py``); skips the test where loop mounts cannot work."""
    reason = _loop_mounts_work()
    if reason is not None:
        pytest.skip(reason)
    image = tmp_path / "disk.img"
    with open(image, "wb") as handle:
        handle.truncate(IMAGE_MB << 20)
    run("mkfs.ext4", "-q", "-F", "-O", "^has_journal", str(image))
    try:
        fs = LoopFs(image, tmp_path / "mnt")
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot mount a loop device here: {exc.stderr.strip()}")
    try:
        yield fs
    finally:
        fs.close()


@contextlib.contextmanager
def after_power_loss(fs: LoopFs, name: str, fsck: str | None = None, *, writable: bool = False,
                     source: Path | None = None) -> Iterator[Path]:
    """What the device holds now, mounted read-only: a copy of the image taken while the file system
    stays mounted, checked first with ``e2fsck fsck`` when given (which must fix or find nothing:
    exit 0 or 1; 4 is a boot that stops and asks). Yields the copy's mount point.

    ``writable``: mounted read-write, the machine booted again, for what a restarted host or the
    next run must finish. ``source``: a copy taken earlier (the instant of that power loss)
    instead of the device now."""
    copy = fs.image.with_name(name)
    run("cp", "--sparse=always", str(source or fs.image), str(copy))  # only the blocks the file system wrote
    if fsck is not None:
        checked = run("e2fsck", fsck, str(copy), check=False)
        assert checked.returncode in (0, 1), checked.stdout + checked.stderr
    mounted = LoopFs(copy, fs.image.with_name(f"{'rw' if writable else 'ro'}-{name}"), read_only=not writable)
    try:
        yield mounted.mount
    finally:
        mounted.close()


def problems(st: store.Store, created: list[str]) -> dict[str, str]:
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


def seen(mount: Path, *parts: str) -> store.Store:
    return store.Store(str(mount.joinpath(*parts, "store")), create=False)
