"""Locks on store files: ``flock``, blocking in the kernel or polled under a timeout.

A session's lock is an ``flock`` on its own file (``sessions/<id>``, taken
through ``store/session_file.py``); the children and roots indexes are their
own locks too (``store/index_file.py``, from format 4). No store file has a
lock file beside it.

* ``flock_within`` polls ``LOCK_EX | LOCK_NB`` (0.1 ms, backing off to
  20 ms) under a deadline, for holders that must report a stuck peer rather
  than wait for it forever (lease takeovers, ``gc``, index rebuilds, and an
  acceptance whose caller has a deadline: a message for a child whose file a
  stopped process holds locked); the writers' hot paths (a log's appends)
  block in the kernel instead, which wakes a waiter at once. An uncontended
  poll is one ``flock`` call, as a blocking one is; a poll starts short because
  the holder it usually meets is in a critical section of one fsync.
* ``PinnedLock`` polls like ``flock_within``, but never creates the file's
  folder and holds the lock only while the path still names the file it
  locked (``pin_flock``). Lease acquisition and ``gc`` lock a session's file
  this way: a session that ``gc`` moved to the trash while a taker waited is
  found gone (``FileNotFoundError``), never re-created.

``flock`` belongs to an open file description: two descriptions of one file
exclude each other even inside one process, so a lock must never be nested
in one thread. Descriptors are opened ``O_CLOEXEC`` and the pool starts
workers with forkserver/spawn, so a lock is never inherited across a fork.
Plain ``flock`` is unfair (a holder that unlocks and re-locks at once can beat
a waiter the kernel just woke); an earlier turnstile for strict alternation
was removed because a writer frozen while queued (SIGSTOP, a hung host) kept
everyone out (``tests/store/test_locks.py``).
"""

from __future__ import annotations

import fcntl
import os
import time
from types import TracebackType

from .atomic import FILE_MODE, NOFOLLOW
from .errors import LockTimeoutError

__all__ = ["PinnedLock", "pin_flock", "flock_within", "names_file", "LOCK_TIMEOUT_S"]

# Long enough for any critical section of the store (a few fsyncs); a lock
# held longer than this means a stuck process, reported as a Timeout.
LOCK_TIMEOUT_S = 30.0


def pin_flock(fd: int, path: str, timeout: float | None = None) -> None:
    """``flock`` ``fd`` (polled under ``timeout``, default ``LOCK_TIMEOUT_S``, then
    ``LockTimeoutError``) and check that ``path`` still names it: ``FileNotFoundError``
    (the lock released) when it was moved or removed while we waited."""
    flock_within(fd, path, timeout)
    if not names_file(path, fd):
        fcntl.flock(fd, fcntl.LOCK_UN)
        raise FileNotFoundError(f"{path} was moved or removed while its lock was awaited")


def flock_within(fd: int, path: str, timeout: float | None = None) -> None:
    """``flock`` ``fd``, polled (0.1 ms, backing off to 20 ms) under ``timeout`` (default
    ``LOCK_TIMEOUT_S``; 0: one try), then ``LockTimeoutError`` naming ``path``."""
    deadline = time.monotonic() + (LOCK_TIMEOUT_S if timeout is None else timeout)
    delay = 0.0001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockTimeoutError(path) from None
            time.sleep(delay)  # a poll interval under a deadline
            delay = min(delay * 2, 0.02)


def names_file(path: str, fd: int, ino: int | None = None) -> bool:
    """Whether ``path`` still names the file open on ``fd`` (not renamed away, removed or replaced). ``ino``:
    ``fd``'s inode number, when the caller keeps it (an open file's never changes: one ``fstat`` fewer)."""
    try:
        return os.stat(path, follow_symlinks=False).st_ino == (os.fstat(fd).st_ino if ino is None else ino)
    except FileNotFoundError:
        return False


class PinnedLock:
    """``flock`` on ``path`` under a timeout, held only while ``path`` still names the locked file.

    ``acquire`` opens the file (creating the file, never its folder), polls
    ``LOCK_EX | LOCK_NB`` (0.1 ms, backing off to 20 ms) until ``timeout``
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
