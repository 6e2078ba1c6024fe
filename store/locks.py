"""Session locks: one lock file per session, two ways to take it.

* ``SessionFlock`` keeps a descriptor of ``sessions/<id>/.lock`` open for the
  life of a writer and takes ``fcntl.flock`` on it for each critical section:
  about 1 µs, blocking in the kernel (no polling). It is the append path's lock.
* ``session_filelock`` is a ``filelock.FileLock`` on the same file, for rare
  operations (creation, lease acquisition and takeover, index updates) where a
  timeout matters more than speed. Its poll interval is 1 ms, not filelock's
  50 ms default, which stalled waiters for 50–350 ms under contention.

Both are ``flock`` locks on the same file, so they exclude each other across
processes. They must never be nested in one thread (two open file
descriptions of one file conflict even inside one process). Descriptors are
opened ``O_CLOEXEC`` and the pool starts workers with forkserver/spawn, so a
lock is never inherited across a fork. The lock file is never deleted:
deleting it would split waiters across two inodes (filelock's note).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
from types import TracebackType
from typing import Iterator

import filelock

from .atomic import FILE_MODE
from .errors import LockTimeoutError

__all__ = ["SessionFlock", "file_lock", "make_filelock", "LOCK_TIMEOUT_S"]

# The turnstile of a fair SessionFlock: an OFD write lock on byte 0 (``struct flock``:
# short type, short whence, off_t start, off_t len, pid_t pid — 0 for OFD locks).
_OFD_SETLKW: int | None = getattr(fcntl, "F_OFD_SETLKW", None)
_TURNSTILE_LOCK = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0)
_TURNSTILE_UNLOCK = struct.pack("hhqqi4x", fcntl.F_UNLCK, os.SEEK_SET, 0, 1, 0)

# Long enough for any critical section of the store (a few fsyncs); a lock
# held longer than this means a stuck process, reported as a Timeout.
LOCK_TIMEOUT_S = 30.0


class SessionFlock:
    """A long-lived descriptor on a lock file, flocked per critical section.

    ``fair=True`` (the append path) queues through a turnstile first: an OFD
    byte-range lock on byte 0 of the same file → ``flock`` → unlock the
    turnstile. ``flock`` alone is unfair — a writer that unlocks and re-locks at
    once beats the waiter the kernel just woke, and runs of 500–1,100 appends by
    one writer were measured while the other waited. With the turnstile, the
    waiter holds it while it waits for the main lock, so the re-locking writer
    must queue behind it: two writers alternate. Lock order is always turnstile →
    main and the turnstile is never held while waiting for anything else, so
    paths that take only the main lock (mailbox, lease) cannot deadlock with it.

    Why an OFD lock on the same file rather than a second lock file: on Linux
    ``flock`` and record locks are independent, so one file carries both, and a
    session costs one inode fewer to create (creating inodes is what a child's
    creation spends most on, on some file systems). OFD locks belong to the
    open file description like ``flock`` — two writers in one process still
    exclude each other, and closing another descriptor of the file (filelock
    does) does not drop them, unlike POSIX ``lockf`` locks. Where the platform
    has no OFD locks the turnstile is skipped (plain, unfair ``flock``).
    """

    def __init__(self, path: str, *, fair: bool = False) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        self._fair = fair and _OFD_SETLKW is not None

    def acquire(self) -> None:
        fd = self._fd
        if fd is None:
            raise ValueError(f"lock {self.path} is closed")
        if not self._fair:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return
        fcntl.fcntl(fd, _OFD_SETLKW, _TURNSTILE_LOCK)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        finally:
            fcntl.fcntl(fd, _OFD_SETLKW, _TURNSTILE_UNLOCK)

    def release(self) -> None:
        assert self._fd is not None
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def __enter__(self) -> "SessionFlock":
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def make_filelock(path: str) -> filelock.FileLock:
    """The ``filelock.FileLock`` the store uses: our timeout, a 1 ms poll, never deleted."""
    return filelock.FileLock(
        path,
        timeout=LOCK_TIMEOUT_S,
        mode=FILE_MODE,
        thread_local=False,
        poll_interval=0.001,
        preserve_lock_file=True,
        fallback_to_soft=False,
    )


@contextlib.contextmanager
def file_lock(path: str) -> Iterator[None]:
    """Hold ``make_filelock(path)``; a timeout is ``LockTimeoutError``."""
    lock = make_filelock(path)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise LockTimeoutError(path) from None
    try:
        yield
    finally:
        lock.release()
