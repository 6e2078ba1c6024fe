"""Children indexes held open between appends: a worker's ``settled`` rows without an open per child.

A worker that releases its one-shot children appends one ``settled`` row per
child to the parent's index (``store/rows.py``); siblings share the parent,
so ``IndexWriters`` keeps the lock file and the index file of the last few
parents open instead of opening and closing both for every row (measured:
see the commit that added it). Nothing is trusted across appends: under the
lock, every append checks that the locked file and the open index still
have a link (``drop_index`` unlinks both, under the lock, for a parent that
is gone; ``reindex`` renames a new index over the old one or unlinks it;
nothing in the store renames either away), and opens them again when not,
so a kept descriptor never locks a file nobody else locks nor appends to a
file nobody reads. Appends are serialised by a mutex: ``flock`` belongs to an
open file description, so two threads sharing one would not exclude each
other. Called by ``store/index.py`` (``mark_settled``) for the worker's
session layer (``worker/sessions.py``), which owns and closes it.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections import OrderedDict
from typing import Any, Sequence

from .appender import append_records, open_appendable
from .atomic import FILE_MODE, NOFOLLOW
from .root import Store

__all__ = ["IndexWriters"]

# parents whose index stays open: a worker's turns are mostly siblings of a few parents
DEFAULT_OPEN = 8


class _OpenIndex:
    """One parent's lock file and index file, open between appends (used under ``IndexWriters``' mutex)."""

    def __init__(self, store: Store, parent_id: str) -> None:
        self.owner = parent_id
        self.key = f"index/children/{parent_id}"
        self.path = store.children_index_path(parent_id)
        self.lock_path = self.path + ".lock"
        self._lock_fd = -1
        self._fd = -1

    def lock(self) -> None:
        """``flock`` the lock file, opened again when it was removed while we held it open.

        The store removes a lock file only by unlinking it (``drop_index``, under the
        lock) and never renames one, so a link count of 0 once locked is the one sign
        that the path names another file (or none): one ``fstat``, not a path lookup.
        """
        while True:
            if self._lock_fd < 0:
                self._lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | NOFOLLOW, FILE_MODE)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            if os.fstat(self._lock_fd).st_nlink:
                return
            # removed while we held it open: whoever comes next creates and locks a new file
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            self._close_lock()

    def unlock(self) -> None:
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def index_size(self, tails: dict[str, tuple[int, int]]) -> int:
        """Under the lock: the index's size, opening it again when it was removed or replaced.

        The store removes an index by unlinking it (``drop_index``, ``reindex``) and replaces
        it by renaming a new file over it (``reindex``): either leaves the open file without
        a link, which the ``fstat`` that gives the size shows.
        """
        if self._fd >= 0:
            info = os.fstat(self._fd)
            if info.st_nlink:
                return info.st_size
            os.close(self._fd)
            self._fd = -1
            tails.pop(self.key, None)  # the checkpoint of the file we had open, not of the new one
        fd, info = open_appendable(self.path, owner=self.owner, key=self.key)
        self._fd = fd
        return info.st_size

    @property
    def fd(self) -> int:
        return self._fd

    def _close_lock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def close(self) -> None:
        self._close_lock()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class IndexWriters:
    """Appends to the children indexes of up to ``size`` parents through descriptors kept open. Thread-safe."""

    def __init__(self, store: Store, *, size: int = DEFAULT_OPEN) -> None:
        self._store = store
        self._size = size
        self._mutex = threading.Lock()
        self._open: OrderedDict[str, _OpenIndex] = OrderedDict()  # least recently used first

    def append(self, parent_id: str, records: Sequence[dict[str, Any]], *, durable: bool = True) -> int:
        """Append ``records`` to ``parent_id``'s index under its lock, as ``appender.append_durably`` does
        (damage is stepped over, as every index append does); returns the first record's seq."""
        store = self._store
        key = f"index/children/{parent_id}"
        # no framing before the lock (``append_durably`` frames twice): ``append_records`` frames
        # every record before it changes a byte, so a record over the limit still leaves no trace
        what = f"children index of {parent_id}"
        with self._mutex:
            index = self._open.pop(parent_id, None)
            if index is None:
                index = _OpenIndex(store, parent_id)
                while len(self._open) >= self._size:
                    self._open.popitem(last=False)[1].close()
            try:
                index.lock()
                try:
                    size = index.index_size(store.index_tails)
                    seq = append_records(index.fd, records, tails=store.index_tails, key=key, owner=parent_id,
                                         limit=store.max_record_bytes, skip_damage=True, size=size)
                    if durable:
                        store.durability.commit_append(index.fd, what)
                finally:
                    index.unlock()
            except BaseException:
                index.close()  # a failed append keeps nothing open: the next one starts afresh
                raise
            self._open[parent_id] = index
            return seq

    def close(self) -> None:
        """Close every descriptor kept open (a later append opens its own again)."""
        with self._mutex:
            while self._open:
                self._open.popitem()[1].close()
