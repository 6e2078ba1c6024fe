"""An index file that is its own lock (store format 4).

The children indexes (``index/children/<parent-id>``) and the roots index
(``index/roots``) are appended to by many processes, each append under an
``flock``. Up to format 3 that lock was taken on an empty ``<name>.lock``
file beside the index — one more inode for every parent — because
``reindex`` replaces an index by renaming a new file over it, and a lock on
the replaced file would not exclude a writer of the new one.

From format 4 the lock is the index file itself, taken on the descriptor the
appends write through, and checked once held. The store removes an index
only by unlinking it (``drop_index``, ``reindex``) and replaces one only by
renaming a new file over it (``reindex``, the roots index's compaction),
never by renaming one away, so either leaves the file it removed or replaced
with no link. A holder that finds a link count of 0 once locked unlocks,
opens the path again and retries: whoever holds the lock of a linked index
holds the one lock every other writer of that path takes. The check is one
``fstat``, whose size the append then uses.

A ``flock`` belongs to an open file description: two ``IndexFile`` of one
path in one process exclude each other like two processes, and one
``IndexFile`` must not be shared by two threads without a mutex of their own
(``store/index_writers.py`` has one).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from types import TracebackType
from typing import Iterator

from .appender import open_appendable
from .checkpoints import AppendCheckpoints
from .locks import LOCK_TIMEOUT_S, flock_within

__all__ = ["IndexFile", "rebuilding"]


class IndexFile:
    """An index file open for appends, locked by ``acquire`` and released by ``release``.

    ``acquire`` opens the file (creating it, empty, when it does not exist)
    unless a descriptor from an earlier ``acquire`` is still open; a
    descriptor may be kept open between critical sections (``close`` ends
    it). ``tails`` is the owner's map of append checkpoints
    (``Store.index_tails``): the checkpoint of a file found replaced is
    dropped, as it points into the old file.
    """

    def __init__(self, path: str, *, owner: str, key: str, tails: AppendCheckpoints | None = None) -> None:
        self.path = path
        self.owner = owner  # the session or "roots" an error names
        self.key = key  # the index's name in errors and in ``tails``
        self._tails = tails
        self._fd = -1
        self._size = 0

    def acquire(self, timeout: float | None = None) -> None:
        """Lock the file that ``path`` names now: blocking in the kernel, or polled under
        ``timeout`` (``LockTimeoutError``) for rare, long holders that must not wait forever
        (rebuilds). ``UnavailableSessionError`` when something else than a regular file is in
        the index's place."""
        while True:
            if self._fd < 0:
                self._fd, _ = open_appendable(self.path, owner=self.owner, key=self.key)
            try:
                if timeout is None:
                    fcntl.flock(self._fd, fcntl.LOCK_EX)
                else:
                    flock_within(self._fd, self.path, timeout)
            except BaseException:
                self.close()
                raise
            info = os.fstat(self._fd)
            if info.st_nlink:
                self._size = info.st_size
                return
            # removed or replaced while we waited (or while it stayed open): open the path again
            self.close()
            if self._tails is not None:
                self._tails.pop(self.key, None)

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    @property
    def fd(self) -> int:
        """The locked file's descriptor (``O_APPEND``): valid between ``acquire`` and ``close``."""
        return self._fd

    @property
    def size(self) -> int:
        """The file's size when the lock was taken (what is appended lands there)."""
        return self._size

    def close(self) -> None:
        """Close the descriptor (which releases a lock still held)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "IndexFile":
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


@contextlib.contextmanager
def rebuilding(index: IndexFile) -> Iterator[IndexFile]:
    """Hold ``index``'s lock for a rewrite or a removal, then close it: polled under
    ``LOCK_TIMEOUT_S`` (a stuck appender is reported, not waited for forever), creating an
    empty index when there is none."""
    try:
        index.acquire(timeout=LOCK_TIMEOUT_S)
        yield index
    finally:
        index.close()
