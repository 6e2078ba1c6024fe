"""Locks on store files: ``flock`` on a long-lived descriptor, or polled under a timeout.

A session's lock is an ``flock`` on its own file (``sessions/<id>``, taken
through ``store/session_file.py``); the children and roots indexes have a
``.lock`` file beside them, because ``reindex`` replaces the index file itself.

* ``SessionFlock`` keeps a descriptor of a lock file open for the life of its
  user and takes ``fcntl.flock`` on it for each critical section: about 1 µs,
  blocking in the kernel (no polling).
* ``file_lock`` is a ``filelock.FileLock`` on the same file, for rare
  operations (index rebuilds) where a timeout matters more than speed. Its
  poll interval is 1 ms, not filelock's 50 ms default, which stalled waiters
  for 50–350 ms under contention.
* ``PinnedLock`` polls ``flock`` with a timeout like ``file_lock``, but never
  creates the lock file's folder and holds the lock only while the path still
  names the file it locked (``pin_flock``). Lease acquisition and ``gc`` lock a
  session's file this way: a session that ``gc`` moved to the trash while a
  taker waited is found gone (``FileNotFoundError``), never re-created.

Both are ``flock`` locks on the same file, so they exclude each other across
processes. They must never be nested in one thread (two open file
descriptions of one file conflict even inside one process). Descriptors are
opened ``O_CLOEXEC`` and the pool starts workers with forkserver/spawn, so a
lock is never inherited across a fork. The lock file is never deleted:
deleting it would split waiters across two inodes (filelock's note). Both
open it with ``O_NOFOLLOW`` (filelock does on its own).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from types import TracebackType
from typing import Iterator

import filelock

from .atomic import FILE_MODE, NOFOLLOW
from .errors import LockTimeoutError

__all__ = ["SessionFlock", "PinnedLock", "pin_flock", "names_file", "file_lock", "make_filelock", "LOCK_TIMEOUT_S"]

# Long enough for any critical section of the store (a few fsyncs); a lock
# held longer than this means a stuck process, reported as a Timeout.
LOCK_TIMEOUT_S = 30.0


class SessionFlock:
    """A long-lived descriptor on a lock file, flocked per critical section.

    Plain ``flock``, which is unfair: a writer that unlocks and re-locks at
    once can beat a waiter the kernel just woke. Under ``strict`` that no
    longer matters — the log's fsync runs after the lock is released (group
    commit, ``store/log.py``), so the releaser spends a whole fsync outside
    the lock and two contending writers interleave (longest run of one writer
    6–15 appends in ``benchmarks/store_append.py``). A tight loop of unsynced
    appends can run ahead of another writer for the length of its burst.

    An earlier version queued writers through a turnstile lock for strict
    alternation. It was removed: a writer frozen (SIGSTOP, a hung host) while
    queued held the turnstile and kept every other writer out even after the
    lock itself was free — the new owner of a taken-over session included
    (``tests/store/test_locks.py``). With plain ``flock`` only a writer frozen
    *inside* its few-microsecond critical section can do that.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW, FILE_MODE)

    def acquire(self) -> None:
        if self._fd is None:
            raise ValueError(f"lock {self.path} is closed")
        fcntl.flock(self._fd, fcntl.LOCK_EX)

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


def pin_flock(fd: int, path: str, timeout: float | None = None) -> None:
    """``flock`` ``fd`` (polled under ``timeout``, default ``LOCK_TIMEOUT_S``, then
    ``LockTimeoutError``) and check that ``path`` still names it: ``FileNotFoundError``
    (the lock released) when it was moved or removed while we waited."""
    deadline = time.monotonic() + (LOCK_TIMEOUT_S if timeout is None else timeout)
    delay = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockTimeoutError(path) from None
            time.sleep(delay)  # a poll interval under a deadline
            delay = min(delay * 2, 0.02)
    if not names_file(path, fd):
        fcntl.flock(fd, fcntl.LOCK_UN)
        raise FileNotFoundError(f"{path} was moved or removed while its lock was awaited")


def names_file(path: str, fd: int) -> bool:
    """Whether ``path`` still names the file open on ``fd`` (not renamed away, removed or replaced)."""
    try:
        return os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


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


class PinnedLock:
    """``flock`` on ``path`` under a timeout, held only while ``path`` still names the locked file.

    ``acquire`` opens the file (creating the file, never its folder), polls
    ``LOCK_EX | LOCK_NB`` (1 ms, backing off to 20 ms) until ``timeout``
    (default ``LOCK_TIMEOUT_S``, then ``LockTimeoutError``), and then checks
    that ``path`` still names the inode it locked: a folder renamed away while
    we waited (``gc`` moving a session to the trash) raises
    ``FileNotFoundError``, as does a folder that is already gone.
    """

    def __init__(self, path: str, *, timeout: float | None = None, create: bool = True) -> None:
        """``create=False`` locks only a file that exists (a session's file: ``FileNotFoundError``
        when it does not, never an empty file in its place)."""
        self.path = path
        self._timeout = timeout
        self._create = create
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | NOFOLLOW | (os.O_CREAT if self._create else 0), FILE_MODE)  # FileNotFoundError: no folder
        try:
            pin_flock(fd, self.path, self._timeout)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None

    def __enter__(self) -> "PinnedLock":
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()
