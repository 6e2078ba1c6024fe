"""Children indexes held open between appends: a worker's ``settled`` rows without an open per child.

A worker that releases its one-shot children appends one ``settled`` row per
child to the parent's index (``store/rows.py``); siblings share the parent,
so ``IndexWriters`` keeps the index files of the last few parents open
instead of opening and closing one for every row (measured: see the commit
that added it). Nothing is trusted across appends: each index is its own
lock, and under it every append checks that the file it holds still has a
link (``store/index_file.py``: ``drop_index`` unlinks an index, ``reindex``
renames a new one over it or unlinks it, and nothing renames one away),
opening the path again when not, so a kept descriptor never appends to a
file nobody reads. Appends are serialised by a mutex: ``flock`` belongs to
an open file description, so two threads sharing one would not exclude each
other. Called by ``store/index.py`` (``mark_settled``) for the worker's
session layer (``worker/sessions.py``), which owns and closes it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Sequence

from .appender import append_records
from .index_file import IndexFile
from .root import Store

__all__ = ["IndexWriters"]

# parents whose index stays open: a worker's turns are mostly siblings of a few parents
DEFAULT_OPEN = 8


class IndexWriters:
    """Appends to the children indexes of up to ``size`` parents through descriptors kept open. Thread-safe."""

    def __init__(self, store: Store, *, size: int = DEFAULT_OPEN) -> None:
        self._store = store
        self._size = size
        self._mutex = threading.Lock()
        self._open: OrderedDict[str, IndexFile] = OrderedDict()  # least recently used first

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
                index = IndexFile(store.children_index_path(parent_id), owner=parent_id, key=key, tails=store.index_tails)
                while len(self._open) >= self._size:
                    self._open.popitem(last=False)[1].close()
            try:
                index.acquire()
                try:
                    seq = append_records(index.fd, records, tails=store.index_tails, key=key, owner=parent_id,
                                         limit=store.max_record_bytes, skip_damage=True, size=index.size)
                    if durable:
                        store.durability.commit_append(index.fd, what)
                finally:
                    index.release()
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
