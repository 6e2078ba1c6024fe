"""Whether anyone but a writer touched a file it keeps open, without reading the file's timestamps.

A writer that keeps a file open between appends (a resident child's mailbox,
``MailboxWriter``) has to notice when another program changed the file in
place since its own last write (its size need not show it), or put another
file at its path. A ``stat`` of the path says so, by the inode and the mtime
and ctime, and reading those timestamps has a price on kernels with
multigrain timestamps (Linux 6.13 on, ext4 among them): once a file's mtime
or ctime is read, its next write is stamped with a fine-grained time, which
dirties the inode, so the fsync after it writes the inode besides the data.
Measured on the repository disk (a 200-byte write in place and its fsync, p50
of 300, four rounds): 0.14–0.20 ms alone, 0.23–0.27 ms after an ``fstat``.

So a writer asks the kernel instead. ``ChangeWatch`` is one inotify instance
with a watch on each open file it is given, for every write, truncation or
allocation through a descriptor (``IN_MODIFY``) and every change of the
file's links or name (``IN_ATTRIB``, ``IN_MOVE_SELF``: unlinked, renamed
away, another file renamed over it), by any process on this machine. The
writer marks the count of its file's events right after its own write
(``settle``) and, before the next one, asks whether the count moved
(``changed``); only then does it ``stat`` the path.

What this cannot see, and the readers still find by their CRCs (``pending``,
``store check``): writes through a shared memory mapping (inotify reports
none), changes made from another machine to a network file system, and a
write made between the writer's own write and its ``settle`` (the kernel
merges the two events into one), the same instant a timestamp comparison
misses. Where the kernel offers no inotify (not Linux) or an instance or
watch limit is reached, ``open`` and ``watch`` return None and the writer
compares timestamps.
"""

from __future__ import annotations

import ctypes
import logging
import os
import struct
import sys
import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["ChangeWatch", "Watched"]

log = logging.getLogger(__name__)

_IN_MODIFY = 0x2  # written, truncated or allocated through a descriptor
_IN_ATTRIB = 0x4  # among others: a link added or removed (unlinked, renamed away, another file renamed over it)
_IN_MOVE_SELF = 0x800
_IN_DELETE_SELF = 0x400
_WATCHED_EVENTS = _IN_MODIFY | _IN_ATTRIB | _IN_MOVE_SELF | _IN_DELETE_SELF
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000  # the kernel removed a watch (our rm_watch, the file deleted, its file system unmounted)
_IN_NONBLOCK = 0o4000  # O_NONBLOCK on Linux: a drain never waits
_IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("=iIII")  # wd, mask, cookie, len (then len bytes of name: none for a watched file)
_READ_SIZE = 64 * 1024


def _libc() -> Any:
    """The C library with its inotify calls typed, or None where it has none (writers compare timestamps)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for name in ("inotify_init1", "inotify_add_watch", "inotify_rm_watch"):
            getattr(libc, name)
    except (OSError, AttributeError):
        return None
    libc.inotify_add_watch.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
    libc.inotify_rm_watch.argtypes = (ctypes.c_int, ctypes.c_int)
    return libc


_LIBC = _libc()


@dataclass(eq=False)
class Watched:
    """One writer's watch on one open file: its events counted up to its own last write."""

    wd: int
    mark: tuple[int, int]  # (the file's event count, the instance's overflows) at the last ``settle``
    held: bool = True  # until ``unwatch``


class ChangeWatch:
    """One inotify instance shared by the writers of one owner (a supervisor's delivery). Thread-safe.

    Each writer holds a ``Watched`` for its open file; two writers of one file share the kernel's
    watch (counted here, removed with the last). Events are drained whenever a writer asks, so the
    queue holds at most what other programs wrote between two acceptances; should it overflow
    anyway, every file counts as changed."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._mutex = threading.Lock()
        self._counts: dict[int, int] = {}  # per watch descriptor: events drained so far
        self._refs: dict[int, int] = {}  # per watch descriptor: the Watched using it
        self._gone: set[int] = set()  # watch descriptors the kernel removed while writers still used them
        self._overflows = 0

    @classmethod
    def open(cls) -> ChangeWatch | None:
        """A new instance, or None where there is none to be had (writers then compare timestamps)."""
        if _LIBC is None:
            return None
        fd = _LIBC.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            log.info("no inotify instance (%s): held mailboxes compare timestamps", os.strerror(code))
            return None
        return cls(fd)

    def watch(self, fd: int) -> Watched | None:
        """Watch the file open on ``fd`` (through ``/proc/self/fd``: the open file, whatever its path names
        now); None when the kernel refuses (the user's watch limit)."""
        with self._mutex:
            if self._fd < 0:
                return None
            wd = _LIBC.inotify_add_watch(self._fd, f"/proc/self/fd/{fd}".encode(), _WATCHED_EVENTS)
            if wd < 0:
                code = ctypes.get_errno()
                log.info("no inotify watch for a held mailbox (%s): it compares timestamps", os.strerror(code))
                return None
            self._refs[wd] = self._refs.get(wd, 0) + 1
            self._counts.setdefault(wd, 0)
            self._drain()
            return Watched(wd, self._mark(wd))

    def changed(self, watched: Watched) -> bool:
        """Whether the file was written since ``watched``'s last ``settle`` (or since it was watched)."""
        with self._mutex:
            if self._fd < 0:
                return True
            self._drain()
            return watched.wd in self._gone or self._mark(watched.wd) != watched.mark

    def settle(self, watched: Watched) -> None:
        """Right after the writer's own write: the events so far are its own."""
        with self._mutex:
            if self._fd < 0:
                return
            self._drain()
            watched.mark = self._mark(watched.wd)

    def unwatch(self, watched: Watched) -> None:
        """``watched``'s writer closed its file: the kernel's watch goes with the last writer using it. Idempotent."""
        with self._mutex:
            if not watched.held:
                return
            watched.held = False
            refs = self._refs.get(watched.wd, 0) - 1
            if refs > 0:
                self._refs[watched.wd] = refs
                return
            self._refs.pop(watched.wd, None)
            self._counts.pop(watched.wd, None)
            if self._fd >= 0 and watched.wd not in self._gone:
                _LIBC.inotify_rm_watch(self._fd, watched.wd)
            self._gone.discard(watched.wd)

    def close(self) -> None:
        """Close the instance; every watch still held reads as changed from now on. Idempotent."""
        with self._mutex:
            fd, self._fd = self._fd, -1
            self._refs.clear()
            self._counts.clear()
            self._gone.clear()
        if fd >= 0:
            os.close(fd)

    def _mark(self, wd: int) -> tuple[int, int]:
        return self._counts.get(wd, -1), self._overflows

    def _drain(self) -> None:
        """Under the mutex: count every event queued. A watch the kernel removed while a writer uses it
        (``IN_IGNORED`` not after our ``rm_watch``: the file deleted, its file system unmounted) reads as
        changed for good: its writer then looks at the path, and watches the file it opens there.

        A read that did not fill half the buffer took every event queued (the kernel gives all that fit),
        so the queue is not read again for the ``EAGAIN`` that would say so: one ``read`` fewer per
        ``settle``, which follows each acceptance's write (an event queued after the read is one the
        next look counts, as it would be after that ``EAGAIN``)."""
        while True:
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                return
            drained = len(data) < _READ_SIZE // 2
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                if mask & _IN_Q_OVERFLOW:
                    self._overflows += 1
                elif wd in self._counts:
                    self._counts[wd] += 1
                    if mask & _IN_IGNORED:
                        self._gone.add(wd)
            if drained:
                return
