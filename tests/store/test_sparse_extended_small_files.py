"""Store files other than a session log or mailbox, extended sparsely by one stray byte far past their end,
are read in bounded memory, with the verdict they had for the same damage at a small size.

``f.seek(1 << 30); f.write(b"x")`` makes a file of 1 GiB that takes a few KiB on disk. The ``STORE`` marker
and an ``.identity`` cache should be tiny: past a size cap they are refused unread, as garbage is (the
marker: ``StoreFormatError`` naming it; the cache: ignored, the log is the authority). The indexes and a
``.control`` file are append logs: they are read as a session's log is (``store/extent.py: read_records``).
Each operation runs in a child process that reports the growth of its peak RSS (``VmHWM``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any, Callable

from subagents import store
from subagents.store.control import request

from ._support import REPO_ROOT, child_env, make_child

EXTENDED = 1 << 30
BOUND_KIB = 48 << 10


def extend(path) -> None:
    with open(path, "r+b") as handle:
        handle.seek(EXTENDED)
        handle.write(b"x")
    assert os.stat(path).st_blocks * 512 < 1 << 20  # sparse: it costs nothing on disk


def measured(root, body: str) -> dict:
    """Run ``body`` (which sets ``result``) in a child process: its result and the growth of its peak RSS (KiB)."""
    script = textwrap.dedent("""
        import json, sys
        from subagents import store
        from subagents.store.check import check_store
        from subagents.store.fsck import fsck
        root = sys.argv[1]
        def peak():
            with open("/proc/self/status") as status:
                return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
        before = peak()
    """) + textwrap.dedent(body) + textwrap.dedent("""
        grown = peak() - before
        print(json.dumps({"grown_kib": grown, "result": result}, default=str))
    """)
    done = subprocess.run([sys.executable, "-c", script, str(root)], capture_output=True, text=True, timeout=300,
                          env=child_env(), cwd=str(REPO_ROOT))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_bounded(found: dict) -> None:
    assert found["grown_kib"] < BOUND_KIB, f"peak RSS grew by {found['grown_kib'] >> 10} MiB"


OPEN = """
    try:
        store.Store(root, create=False)
        result = None
    except store.StoreFormatError as exc:
        result = [type(exc).__name__, str(exc)]
"""


def test_a_sparse_extended_store_marker_is_refused_as_garbage_in_bounded_memory(tmp_path):
    root = tmp_path / "store"
    store.Store(root, durability="none")
    small = tmp_path / "small"
    store.Store(small, durability="none")
    with open(small / "STORE", "ab") as handle:
        handle.write(b"\0x")  # the same damage at a small size: garbage after the map
    found = measured(small, OPEN)
    assert found["result"] is not None and "STORE" in found["result"][1]
    extend(root / "STORE")
    found = measured(root, OPEN)
    assert_bounded(found)
    kind, message = found["result"]
    assert kind == "StoreFormatError" and str(root / "STORE") in message


def test_a_sparse_extended_identity_cache_is_ignored_in_bounded_memory(tmp_path):
    root = tmp_path / "store"
    st = store.Store(root, durability="none")
    padding = ("notice/received", {"padding": "x" * store.log.CACHE_LAG_BYTES})
    store.create_session(st, "s1", events=[padding])
    store.register_owner(st, "o1", ttl=60)
    lease = store.acquire_lease(st, "s1", "o1")
    with store.LogWriter.open(st, "s1", epoch=lease.epoch) as writer:
        writer.append([("turn/start", {}), ("turn/end", {"stop_reason": "completed"})], commit=True)
    store.release_lease(st, "s1", "o1", lease.epoch)
    store.remove_owner(st, "o1")
    path = st.path("s1", "identity")
    assert os.path.exists(path)
    extend(path)
    found = measured(root, """
        from subagents.store.projection import read_cache
        st = store.Store(root)
        cached = read_cache(st.path("s1", "identity"))
        report = check_store(st)
        result = [cached is None, store.read_projection(st, "s1").seq]
    """)
    assert_bounded(found)
    ignored, _seq = found["result"]
    assert ignored  # a cache that is not one whole valid record is ignored: the log is the authority


def _extend_small(path) -> None:
    with open(path, "r+b") as handle:
        handle.seek(os.path.getsize(path) + 4096)
        handle.write(b"x")


def same_verdict(tmp_path, build: Callable[[store.Store], str], body: str) -> Any:
    """``body``'s result for a store ``build`` made, whose file (the path ``build`` returns) got a stray byte 4 KiB
    past its end, then a GiB past it: the two results must agree, and the second cost bounded memory."""
    verdicts = []
    for name, damage in (("small", _extend_small), ("large", extend)):
        root = tmp_path / name
        damage(build(store.Store(root, durability="none")))
        found = measured(root, body)
        if name == "large":
            assert_bounded(found)
        verdicts.append(found["result"])
    assert verdicts[0] == verdicts[1]
    return verdicts[1]


def _parent_of_two(st: store.Store) -> str:
    store.create_session(st, "root")
    for child in ("c1", "c2"):
        make_child(st, "root", child)
    return st.children_index_path("root")


def _interrupted_once(st: store.Store) -> str:
    store.create_session(st, "s1")
    request(st, "s1", "interrupt", {"reason": "first"}, ids=store.IdGenerator())
    return st.path("s1", "control")


def _roots(*ids: str) -> Callable[[store.Store], str]:
    def build(st: store.Store) -> str:
        for session in ids:
            store.create_session(st, session)
        return os.path.join(st.root, "index", "roots")
    return build


def test_a_sparse_extended_children_index_lists_its_children_in_bounded_memory(tmp_path):
    found = same_verdict(tmp_path, _parent_of_two, """
        from subagents.store.index_read import read_index
        st = store.Store(root)
        read = read_index(st, "root")
        result = [[e.id for e in read.entries], [p.split(" at byte")[0] for p in read.problems],
                  sorted(r.id for r in store.list_children(st, "root"))]
    """)
    assert found[0] == ["c1", "c2"] and found[2] == ["c1", "c2"]


def test_a_sparse_extended_control_file_reads_its_records_in_bounded_memory(tmp_path):
    found = same_verdict(tmp_path, _interrupted_once, """
        from subagents.store.control import read_controls
        st = store.Store(root)
        result = [[[c.kind, c.data] for c in read_controls(st, "s1")],
                  sorted(f["kind"] for f in fsck(st, repair=False, lease_ttl_s=30.0)["findings"] if f["id"] == "s1")]
    """)
    assert found[0] == [["interrupt", {"reason": "first"}]]


def test_a_sparse_extended_roots_index_lists_its_roots_in_bounded_memory(tmp_path):
    """``index/roots`` is read from its end, newest first, a window at a time: a window of zeros before a
    stray byte held no record, the window grew until it was the whole file, read in one piece (every
    ``ls`` of the store paid it)."""
    found = same_verdict(tmp_path, _roots("r1", "r2", "r3"), """
        from subagents.store.roots import compact_roots, indexed_roots, roots_index_problem
        st = store.Store(root)
        page = store.find_roots(st, limit=2)
        problem = roots_index_problem(st)
        result = [sorted(r.id for r in store.list_roots(st)), [r.id for r in page.rows], sorted(indexed_roots(st) or []),
                  problem is None, sorted(f["kind"] for f in fsck(st, repair=False, lease_ttl_s=30.0)["findings"])]
    """)
    assert found[0] == ["r1", "r2", "r3"] and found[1] == ["r3", "r2"]


# Appends: the appender read from its checkpoint to the file's size, and on damage read the whole file
# twice more; a stray byte a GiB past an index's records cost a child's creation (or an interrupt's
# control record, or a new root) three GiB reads. The verdict is the small file's: the stray byte is a
# torn tail an index append cuts, and what was there before stays listed.

def test_a_child_created_under_a_sparse_extended_children_index_is_appended_in_bounded_memory(tmp_path):
    found = same_verdict(tmp_path, _parent_of_two, """
        import os
        from subagents.store.index_read import read_index
        from tests.store._support import make_child
        st = store.Store(root)
        make_child(st, "root", "c3")
        read = read_index(st, "root")
        result = [[e.id for e in read.entries], read.problems, os.path.getsize(st.children_index_path("root")) < 1 << 20]
    """)
    assert found == [["c1", "c2", "c3"], [], True]


def test_a_control_record_appended_to_a_sparse_extended_control_file_costs_bounded_memory(tmp_path):
    found = same_verdict(tmp_path, _interrupted_once, """
        import os
        from subagents.store.control import read_controls, request
        st = store.Store(root)
        request(st, "s1", "interrupt", {"reason": "second"}, ids=store.IdGenerator())
        result = [[c.data["reason"] for c in read_controls(st, "s1")], os.path.getsize(st.path("s1", "control")) < 1 << 20]
    """)
    assert found == [["first", "second"], True]


def test_a_root_registered_in_a_sparse_extended_roots_index_costs_bounded_memory(tmp_path):
    found = same_verdict(tmp_path, _roots("r1"), """
        st = store.Store(root)
        store.create_session(st, "r2")
        result = sorted(r.id for r in store.list_roots(st))
    """)
    assert found == ["r1", "r2"]
