"""A process reads on in a children index it read before, and its answers stay those of a whole read.

A cold resume asks one child's committed end (``store/committed.py``), and read its parent's whole
index to do so: a probe saw a followup to a settled child take 50 ms beside 4,000 siblings. The
fold of an index read whole and clean is kept, and the next ask reads only what was appended; a
file rewritten (another inode), cut, changed before that point, damaged or in the middle of an
append is read whole again. Each step here compares the kept answer with a careful whole read.
"""

from __future__ import annotations

import os

from subagents import store
from subagents.store import committed
from subagents.store.index import reindex

from ._support import make_child


def _whole(st: store.Store, parent: str) -> dict[str, int]:
    return {e.id: e.committed_end for e in store.read_index(st, parent).entries if e.committed_end is not None}


def _settle(st: store.Store, child: str, owner: str) -> None:
    epoch = store.acquire_lease(st, child, owner).epoch
    with store.LogWriter.open(st, child, epoch=epoch) as writer:
        writer.append([("turn/start", {}), ("turn/end", {"stop_reason": "completed", "diagnostic": None})], commit=True)
    store.release_lease(st, child, owner, epoch)


def test_the_kept_fold_answers_as_a_whole_read_through_appends_rewrites_cuts_and_damage(st) -> None:
    owner = store.new_id()
    store.register_owner(st, owner, ttl=60.0)
    store.create_session(st, "p")
    for n in range(5):
        make_child(st, "p", f"c{n}")
        _settle(st, f"c{n}", owner)
    assert committed._ends_of(st, "p") == _whole(st, "p") and len(_whole(st, "p")) == 5
    path = st.children_index_path("p")

    make_child(st, "p", "c5")  # appended: read on
    _settle(st, "c5", owner)
    _settle(st, "c0", owner)  # a later settled row for a child already known: its new end
    assert committed._ends_of(st, "p") == _whole(st, "p") and len(_whole(st, "p")) == 6

    data = bytearray(open(path, "rb").read())
    data[-3] ^= 0x01  # the last record changed in place after it was read: the mark tells
    with open(path, "r+b") as handle:
        handle.write(bytes(data))
    assert committed._ends_of(st, "p") == _whole(st, "p")
    data[-3] ^= 0x01
    with open(path, "r+b") as handle:
        handle.write(bytes(data))
    assert committed._ends_of(st, "p") == _whole(st, "p")

    reindex(st)  # a new file in its place (it keeps no settled rows: no ends, until children settle again)
    assert committed._ends_of(st, "p") == _whole(st, "p") == {}
    _settle(st, "c3", owner)
    assert committed._ends_of(st, "p") == _whole(st, "p") and list(_whole(st, "p")) == ["c3"]

    with open(path, "ab") as handle:
        handle.write(b"\x05\x00\x00\x00garbage")  # a record in flight, or damage: read whole, carefully
    assert committed._ends_of(st, "p") == _whole(st, "p")
    os.truncate(path, os.path.getsize(path) - 11)

    os.truncate(path, 0)  # cut: nothing to claim
    assert committed._ends_of(st, "p") == _whole(st, "p") == {}
