"""Small durable file primitives: private modes, atomic replace, directory fsync.

Files are created 0600 and folders 0700 (the store may hold transcripts).
``write_atomic`` is tmp file + optional fsync + rename + optional fsync of the
folder: a reader sees the old bytes or the new bytes, never a mix. What is
*not* guaranteed without ``durable=True``: that the new bytes survive a power
loss (the rename may be lost; the old file then remains). ``write_unnamed``
and ``NewFile``'s steps make a file that must not exist yet, whole or not at
all, from an unnamed file where the system has them. ``remove_durably``
deletes files and folders so that their names cannot come back naming
someone else's inode after a power loss, and writes a deleted file's inode
as deleted (so does ``write_atomic`` for the file it replaces): the boot's
``e2fsck -p`` of a file system without a journal then has nothing to ask.

Every open here passes ``O_NOFOLLOW``: a link planted in place of a store
file is refused (``ELOOP``), never read or written through.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import shutil
import stat
from typing import Iterable

from .errors import DurabilityError

__all__ = [
    "FILE_MODE", "DIR_MODE", "NOFOLLOW", "make_dirs", "write_atomic", "write_new", "NewFile", "write_unnamed",
    "fsync_dir", "remove_durably", "read_bytes", "pread_all",
]

FILE_MODE = 0o600
DIR_MODE = 0o700
# added to the flags of every open of a store file (atomic.py, log.py, locks.py, ...)
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
# removals held open at once by ``remove_durably`` (one fsync of their folders per group)
_HELD_AT_ONCE = 64


def make_dirs(*paths: str, durable: bool = False) -> None:
    """Each of ``paths`` and every missing folder above it, 0700. ``durable``: each folder this call
    made is fsync'd, then the folder it was made in, deepest first and each once, so a power loss
    leaves them whole.

    A new folder's own fsync is what writes its first block (``.`` and ``..``) and its inode; the
    parent's writes its name. Without a journal nothing else writes them before writeback, and a
    name whose folder block never reached the disk is one that the boot's ``e2fsck -p`` stops at
    ("directory corrupted", run fsck manually)."""
    made: list[str] = []
    for path in paths:
        missing: list[str] = []
        current = os.path.abspath(path)
        while not os.path.isdir(current) and os.path.dirname(current) != current:
            missing.append(current)
            current = os.path.dirname(current)
        for folder in reversed(missing):
            try:
                os.mkdir(folder, DIR_MODE)
            except FileExistsError:
                if not os.path.isdir(folder):
                    raise
                continue  # another process made it: its maker syncs it
            made.append(folder)
    if durable:
        # deeper folders first: each one's own block, then its parent's entry for it
        synced = {f for folder in made for f in (folder, os.path.dirname(folder))}
        for folder in sorted(synced, key=lambda f: f.count(os.sep), reverse=True):
            fsync_dir(folder)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        raise DurabilityError(f"fsync of folder {path} failed: {exc}", path=path) from exc
    finally:
        os.close(fd)


def remove_durably(paths: Iterable[str], *, durable: bool, ignore_errors: bool = False) -> int:
    """Remove each of ``paths`` (a folder with everything in it), then fsync the folders they were in,
    then each removed file (``durable``); how many it removed (a path already gone is skipped).

    Each one is held open (its inode stays allocated) until those fsyncs. Without a journal a
    removed name reaches the disk only with its folder's fsync, while its inode is free for any
    new file or folder at once: a power loss in between would bring the name back naming someone
    else's, which the store would read as its own (a session, an index, a trash folder). Names
    inside a removed folder are not held: once its removal is durable nothing reaches them, and
    before that they are links the next removal takes away again. A removed file's own fsync,
    after its folder's, is ``_sync_unlinked``'s. ``ignore_errors``: a path that cannot be removed
    is left (a failed fsync still raises ``DurabilityError``)."""
    paths = list(paths)
    removed = 0
    for start in range(0, len(paths), _HELD_AT_ONCE):
        group = paths[start:start + _HELD_AT_ONCE]
        held: list[int] = []
        try:
            for path in group:
                try:
                    fd = _hold(path)
                    if fd is None:
                        continue
                    held.append(fd)
                    if stat.S_ISDIR(os.fstat(fd).st_mode):
                        shutil.rmtree(path)
                    else:
                        os.unlink(path)
                except OSError:
                    if not ignore_errors:
                        raise
                    continue
                removed += 1
            if durable and held:
                for folder in sorted({os.path.dirname(path) for path in group}):
                    fsync_dir(folder)
                for fd in held:
                    _sync_unlinked(fd)
        finally:
            for fd in held:
                os.close(fd)
    return removed


def _hold(path: str) -> int | None:
    """A descriptor that keeps the inode ``path`` names allocated after the name goes (``None``: no
    such name): read-only where it can be (a regular file's can then be fsync'd), ``O_PATH`` for
    a link, a socket or a file it may not read. ``O_NONBLOCK``: a FIFO does not block the open."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError:
        return os.open(path, os.O_PATH | NOFOLLOW)


def _sync_unlinked(fd: int) -> None:
    """fsync a regular file held open whose last name is gone, that removal already durable (its
    folder fsync'd): this writes its inode with a link count of 0. Without a journal nothing else
    writes a freed inode before writeback, and one still written as in use that no folder names
    is an "unattached inode" the boot's ``e2fsck -p`` stops at for an operator; one written with
    no link is a deleted inode it clears itself. Anything else held (a folder, whose files were
    unlinked unheld; a descriptor that cannot be fsync'd) is left as it is."""
    if not stat.S_ISREG(os.fstat(fd).st_mode) or fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_PATH:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        raise DurabilityError(f"fsync of a removed file failed: {exc}") from exc


def write_atomic(path: str, data: bytes, *, durable: bool, exclusive: bool = False, sync_dir: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically.

    ``sync_dir=False`` skips the folder fsync when the caller fsyncs the
    folder itself after several files (one fsync persists every name in it).

    ``exclusive`` refuses to replace an existing file (``FileExistsError``),
    using ``link`` instead of ``rename`` so two creators cannot both win.

    ``durable``, with the folder's fsync: the file replaced is held open
    until then and fsync'd after it (``remove_durably``'s reasons: its inode
    is not reused while the old name may still come back, and is written
    as deleted for the boot's ``e2fsck -p``).
    """
    folder = os.path.dirname(path)
    old = _hold(path) if durable and sync_dir and not exclusive else None
    try:
        tmp = f"{path}.tmp.{os.getpid()}.{id(data):x}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, FILE_MODE)
        try:
            try:
                _write_whole(fd, data, path, durable=durable)
            finally:
                os.close(fd)
            if exclusive:
                os.link(tmp, path)
                os.unlink(tmp)
            else:
                os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        if durable and sync_dir:
            fsync_dir(folder)
            if old is not None:
                _sync_unlinked(old)
    finally:
        if old is not None:
            os.close(old)


def write_new(path: str, data: bytes, *, durable: bool) -> None:
    """Write a file that must not exist yet (``O_EXCL``), in place.

    For a file nothing reads before a later publication step (a session's
    file under its temporary name, published by ``link``): a crash leaves it
    unpublished, so it needs no atomic replacement — one inode and one name
    instead of a tmp file, two names and a rename.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, FILE_MODE)
    try:
        _write_whole(fd, data, path, durable=durable)
    finally:
        os.close(fd)


class NewFile:
    """A file written whole that does not have its name yet (``write_unnamed``).

    Split in steps so a caller making several files can write them all,
    name them all, then sync them all (``store/session.py``): a crash before
    the name leaves nothing anyone lists. ``sync`` after ``publish``, never
    before: an unnamed file's inode has a link count of 0, an fsync before the
    link writes it so, and on a file system without a journal nothing writes
    the link's count before a power loss but the file's own next fsync (the
    name then points at a deleted inode). ``discard`` closes what is left
    open; after ``publish`` the file stays, otherwise it goes.
    """

    def __init__(self, path: str, fd: int, temp_path: str | None) -> None:
        self.path = path
        self._fd = fd
        self._temp_path = temp_path

    def sync(self) -> None:
        """fsync the file's data and inode (``DurabilityError`` if it fails, never retried)."""
        try:
            os.fsync(self._fd)
        except OSError as exc:
            raise DurabilityError(f"write of {self.path} failed: {exc}", path=self.path) from exc

    def publish(self) -> None:
        """Give the file its name with one ``link``, which fails with ``FileExistsError`` if the
        name is taken: two creators of one name cannot both win."""
        if self._temp_path is None:
            # ``src_dir_fd`` makes Python call ``linkat`` with AT_SYMLINK_FOLLOW (plain ``link``
            # would link the /proc entry itself); the source path is absolute, so the fd is not used
            os.link(f"/proc/self/fd/{self._fd}", self.path, src_dir_fd=self._fd, follow_symlinks=True)
        else:
            os.link(self._temp_path, self.path)
            os.unlink(self._temp_path)  # before ``sync``, which then writes a link count of 1
            self._temp_path = None

    def discard(self) -> None:
        """Close the file and remove its temporary name, if it has one (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._temp_path is not None:
            try:
                os.unlink(self._temp_path)
            except FileNotFoundError:
                pass
            self._temp_path = None


def write_unnamed(path: str, data: bytes) -> NewFile:
    """Write ``data`` to a new file that is to be named ``path``, without giving it that name.

    First choice: an unnamed file (``O_TMPFILE``) in the folder of ``path``,
    named through ``/proc/self/fd``. One inode and one directory entry; a crash
    before the link leaves no name (the file system reclaims the inode).
    Measured on ext4: ~100 µs less CPU per file than the fallback, whose second
    name costs a directory insert and removal. Fallback, where the file system
    or kernel has no unnamed files or ``/proc`` is not mounted: the file is
    written under the temporary name ``.<name>.new.<pid>.<hex>`` beside it
    (``O_EXCL``); a crash before ``discard`` leaves that name behind (``fsck``
    reports it).
    """
    temp_path = None
    fd = _open_unnamed(os.path.dirname(path))
    if fd is None:
        folder, name = os.path.split(path)
        temp_path = os.path.join(folder, f".{name}.new.{os.getpid()}.{secrets.token_hex(4)}")
        fd = _open_temporary(temp_path)
    new_file = NewFile(path, fd, temp_path)
    try:
        _write_whole(fd, data, path, durable=False)
    except BaseException:
        new_file.discard()
        raise
    return new_file


def _open_temporary(temp_path: str) -> int:
    """The fallback's file under its temporary name, open for writing (``O_EXCL``)."""
    return os.open(temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, FILE_MODE)


# errors of an O_TMPFILE open that mean "no unnamed files here", not "the folder is unusable"
_NO_UNNAMED = frozenset({errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL})
# an unnamed file is named through /proc/self/fd: without /proc (some containers) it cannot be
_UNNAMED_FLAG = getattr(os, "O_TMPFILE", 0) if os.path.isdir("/proc/self/fd") else 0


def _open_unnamed(folder: str) -> int | None:
    """An unnamed file in ``folder`` open for writing, or None where the system has none."""
    flag = _UNNAMED_FLAG
    if not flag:
        return None
    try:
        return os.open(folder, os.O_WRONLY | flag | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        if exc.errno in _NO_UNNAMED:
            return None
        raise


def _write_whole(fd: int, data: bytes, path: str, *, durable: bool) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
    except OSError as exc:
        raise DurabilityError(f"write of {path} failed: {exc}", path=path) from exc


def read_bytes(path: str, *, offset: int = 0) -> bytes:
    """The file's bytes from ``offset``; ``OSError`` (``ELOOP`` for a link, ``EISDIR`` ...) as the OS says."""
    # O_NONBLOCK: a FIFO planted in place of a file fails the read instead of blocking the open
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
    try:
        return pread_all(fd, offset)
    finally:
        os.close(fd)


def pread_all(fd: int, offset: int = 0) -> bytes:
    """The bytes of the open file from ``offset`` to where ``fstat`` says it ends: a snapshot.

    Bytes appended after the ``fstat`` are not read. A reader without the file's lock that read on
    until a read returned nothing would splice the part of an append that landed between two reads
    onto the zeros (padding) the first read saw where that append begins: a ``turn/end`` after
    damage, an append in flight read as a corrupt log. One ``pread`` of the size, repeated only for
    a short read."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.pread(fd, 1, offset)  # a FIFO or a folder fails here, as the OS says (ESPIPE, EISDIR)
        raise OSError(errno.EINVAL, "not a regular file")
    want = info.st_size - offset
    chunks = []
    while want > 0:
        chunk = os.pread(fd, want, offset)
        if not chunk:
            break  # cut shorter meanwhile
        chunks.append(chunk)
        offset += len(chunk)
        want -= len(chunk)
    return b"".join(chunks)
