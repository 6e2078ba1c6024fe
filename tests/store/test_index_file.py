"""Index files that are their own lock (format 4): no ``.lock`` file, and no append lost to a file that
a rebuild replaced or a ``drop_index`` removed while the appender waited for its lock."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from subagents import store
from subagents.store.atomic import write_atomic
from subagents.store.framing import encode_record, scan_all
from subagents.store.index import add_child, drop_index, remove_child
from subagents.store.index_file import IndexFile

from ._support import ONE_SHOT, REPO_ROOT, make_child, read_file

CREATOR = """
import sys
from subagents import store
st = store.Store(sys.argv[1], durability="none", create=False)
tag, n = sys.argv[2], int(sys.argv[3])
for i in range(n):
    store.create_session(st, f"{tag}x{i}", parent_session="p", origin="subagent", created_at=float(i),
                         events=[("subagent/descriptor", {"mode": "one-shot", "program": "echo"})])
"""


def index_of(st: store.Store, parent: str) -> IndexFile:
    return IndexFile(st.children_index_path(parent), owner=parent, key=f"index/children/{parent}", tails=st.index_tails)


def all_files(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files)


def test_indexes_have_no_lock_files(st):
    """Creating children and roots, settling a child, rebuilding and collecting leave no lock file
    beside any index: a parent costs one file for its children, not two."""
    store.create_session(st, "r")
    make_child(st, "r", "a", descriptor=ONE_SHOT)
    make_child(st, "r", "b", descriptor=ONE_SHOT)
    store.acquire_lease(st, "a", "o1")
    store.release_lease(st, "a", "o1", store.read_lease(st, "a").epoch)  # appends a settled row
    store.reindex(st)
    store.rebuild_roots(st)
    index_files = [f for f in all_files(st.root) if f.startswith("index")]
    assert index_files == ["index/children/r", "index/roots"], index_files


def test_an_append_waiting_for_a_rebuild_lands_in_the_rebuilt_file(st):
    """A rebuild holds the index's lock and renames a new file over it; an append that waited for the
    lock meanwhile finds the file it locked replaced and appends to the new one, after its records."""
    store.create_session(st, "p")
    make_child(st, "p", "a", created_at=1.0)
    rebuild = index_of(st, "p")
    rebuild.acquire(timeout=5)
    done = threading.Event()
    thread = threading.Thread(target=lambda: (make_child(st, "p", "b", created_at=2.0), done.set()), daemon=True)
    thread.start()
    try:
        assert not done.wait(0.3), "the append did not wait for the rebuild's lock"
        blob = b"".join(encode_record({"seq": i, "id": cid, "created_at": float(i + 1), "origin": "subagent"})
                        for i, cid in enumerate(["a"]))
        write_atomic(st.children_index_path("p"), blob, durable=False)
    finally:
        rebuild.close()
    assert done.wait(10)
    thread.join(5)
    records = scan_all(read_file(st.children_index_path("p"))).records
    assert [(r["seq"], r["id"]) for r in records] == [(0, "a"), (1, "b")]
    assert [e.id for e in store.read_children(st, "p")] == ["a", "b"]


def test_an_append_waiting_for_drop_index_lands_in_a_new_file(st):
    """``drop_index`` unlinks the index under its lock; a writer whose descriptor still names the
    unlinked file finds so once it holds the lock and opens the path again, so what it appends
    goes to the file readers read."""
    store.create_session(st, "gone")
    make_child(st, "gone", "a", created_at=1.0)
    os.remove(st.session_path("gone"))  # "gone" has no session now: its index may be dropped
    holder = index_of(st, "gone")
    holder.acquire()
    dropped: list[bool] = []
    drop = threading.Thread(target=lambda: dropped.append(drop_index(st, "gone")), daemon=True)
    drop.start()
    time.sleep(0.1)
    holder.release()  # drop_index takes the lock, unlinks; meanwhile an appender waits on the old file
    drop.join(10)
    assert dropped == [True]
    assert not os.path.lexists(st.children_index_path("gone"))
    holder.acquire()  # the kept descriptor names an unlinked file: it opens the path again
    try:
        assert os.fstat(holder.fd).st_nlink == 1 and holder.size == 0
    finally:
        holder.close()
    add_child(st, "gone", "b", created_at=2.0, origin="subagent", mode="one-shot")  # an appender that opened the index before the drop
    assert [e.id for e in store.read_children(st, "gone")] == ["b"]


def test_a_rebuild_reports_a_stuck_appender_instead_of_waiting_forever(st):
    store.create_session(st, "p")
    make_child(st, "p", "a")
    stuck = index_of(st, "p")
    stuck.acquire()
    waiter = index_of(st, "p")
    try:
        with pytest.raises(store.LockTimeoutError):
            waiter.acquire(timeout=0.2)
    finally:
        waiter.close()
        stuck.close()


def test_no_entry_is_lost_while_processes_append_and_the_index_is_replaced_again_and_again(tmp_path):
    """Three processes create children of one parent (each an index append under the index's own
    lock) while this one replaces the index over and over the way a rebuild does: under its lock, a
    new file with the same records renamed over it. Every child ends up listed: no append went to a
    file already replaced (there, nothing would ever read it)."""
    root = str(tmp_path / "store")
    st = store.Store(root, durability="none")
    store.create_session(st, "p")
    make_child(st, "p", "first")
    path = st.children_index_path("p")
    per_process = 60
    creators = [subprocess.Popen([sys.executable, "-c", CREATOR, root, tag, str(per_process)], cwd=REPO_ROOT)
                for tag in ("a", "b", "c")]
    replaced = 0
    try:
        while any(c.poll() is None for c in creators):
            rewrite = index_of(st, "p")
            try:
                rewrite.acquire(timeout=10)
                write_atomic(path, read_file(path), durable=False)
            finally:
                rewrite.close()
            replaced += 1
    finally:
        for c in creators:
            c.wait(60)
    assert [c.returncode for c in creators] == [0, 0, 0]
    assert replaced >= 3
    listed = {e.id for e in store.read_children(st, "p")}
    assert listed == {"first"} | {f"{tag}x{i}" for tag in "abc" for i in range(per_process)}


def test_a_tombstone_for_a_parent_without_an_index_makes_no_file(st):
    """A parent with no index lists no child, so a tombstone has nothing to hide: no index file is
    made for it (locking the index would otherwise create an empty one)."""
    remove_child(st, "p", "c1")
    remove_child(st, "p", "c1", if_gone=True)
    assert os.listdir(st.children_index_dir) == []
