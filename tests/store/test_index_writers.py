"""``IndexWriters``: settled rows through kept descriptors land in the live index, under its live lock."""

from __future__ import annotations

import os
import sys
import threading
import time

from subagents import store
from subagents.store.framing import scan_all
from subagents.store.index import Settled, drop_index, mark_settled
from subagents.store.index_writers import IndexWriters
from subagents.store.index_file import IndexFile

from ._support import ONE_SHOT, make_child, read_file

ROW = Settled("completed", None, None, 1.0, False)


def settled_ids(st, parent):
    return [e.id for e in store.read_children(st, parent) if e.settled is not None]


def open_indexes(st):
    """The files of ``st``'s children indexes this process holds open."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if path.startswith(st.children_index_dir + "/"):
            out.append(os.path.basename(path))
    return sorted(out)


def test_a_row_after_the_index_was_dropped_and_made_again_lands_in_the_new_file(st):
    """``drop_index`` unlinks the index while a worker keeps it open: the next row goes to the file
    readers read, under the lock other appenders take (the new file's own)."""
    writers = IndexWriters(st)
    store.add_child(st, "p", "c1", created_at=1.0, origin="subagent")
    mark_settled(st, "p", "c1", ROW, writers=writers)
    assert settled_ids(st, "p") == ["c1"]
    assert drop_index(st, "p")  # "p" has no session of its own: gone, as gc leaves it
    store.add_child(st, "p", "c2", created_at=2.0, origin="subagent")  # a new index
    lock = IndexFile(st.children_index_path("p"), owner="p", key="index/children/p")
    lock.acquire()
    done = threading.Event()

    def settle() -> None:
        mark_settled(st, "p", "c2", ROW, writers=writers)
        done.set()

    thread = threading.Thread(target=settle)
    thread.start()
    try:
        # the row waits for the new file's lock holder (a kept descriptor of the removed one would not)
        assert not done.wait(0.3)
        assert settled_ids(st, "p") == []
    finally:
        lock.release()
        lock.close()
    thread.join(10)
    assert done.is_set()
    assert settled_ids(st, "p") == ["c2"]
    records = scan_all(read_file(st.children_index_path("p"))).records
    assert [r["seq"] for r in records] == [0, 1]  # its seq follows the new file's records
    writers.close()


def test_a_row_after_reindex_replaced_the_index_lands_in_the_new_file(st):
    store.create_session(st, "r", created_at=1.0)
    make_child(st, "r", "a", descriptor=ONE_SHOT, created_at=2.0)
    make_child(st, "r", "b", descriptor=ONE_SHOT, created_at=3.0)
    writers = IndexWriters(st)
    mark_settled(st, "r", "a", ROW, writers=writers)
    store.reindex(st)  # renames a rebuilt file over the one the writer holds (settled rows are not rebuilt)
    assert settled_ids(st, "r") == []
    mark_settled(st, "r", "b", ROW, writers=writers)
    assert settled_ids(st, "r") == ["b"]
    writers.close()


def test_threads_and_processes_sharing_an_index_never_share_a_seq(st):
    """Two ``IndexWriters`` (two open file descriptions, as two workers) used by two threads each:
    every row is written once, with its own seq."""
    store.add_child(st, "p", "c", created_at=1.0, origin="subagent")
    pools = [IndexWriters(st), IndexWriters(st)]
    per_thread = 150

    def settle(writers: IndexWriters, tag: str) -> None:
        for i in range(per_thread):
            writers.append("p", [{"id": f"{tag}{i}", "state": "settled", "outcome": "completed", "last_at": 1.0}], durable=False)

    threads = [threading.Thread(target=settle, args=(w, f"{n}-{k}-")) for n, w in enumerate(pools) for k in range(2)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch inside an append, where a shared descriptor's flock would not stop them
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(switch)
    records = scan_all(read_file(st.children_index_path("p"))).records
    assert len(records) == 1 + 4 * per_thread
    assert [r["seq"] for r in records] == list(range(len(records)))
    for w in pools:
        w.close()


def test_kept_descriptors_are_bounded_and_closed(st):
    writers = IndexWriters(st, size=2)
    for parent in ("p1", "p2", "p3"):
        store.add_child(st, parent, "c", created_at=1.0, origin="subagent")
        mark_settled(st, parent, "c", ROW, writers=writers)
    assert open_indexes(st) == ["p2", "p3"]  # p1's was closed
    writers.close()
    assert open_indexes(st) == []
    mark_settled(st, "p1", "c", ROW, writers=writers)  # usable after close: opens again
    assert settled_ids(st, "p1") == ["c"]
    writers.close()


def test_a_failed_append_keeps_nothing_open(st):
    os.makedirs(st.children_index_path("p"))  # a folder where the index should be
    writers = IndexWriters(st)
    try:
        writers.append("p", [{"id": "c", "state": "settled", "outcome": "completed", "last_at": time.time()}], durable=False)
    except store.SubagentError as exc:
        assert exc.code == "UNAVAILABLE_SESSION" or "cannot be opened" in str(exc) or "not a regular file" in str(exc)
    else:
        raise AssertionError("a folder in the index's place was appended to")
    assert open_indexes(st) == []
