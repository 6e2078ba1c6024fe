"""A child's session file extended sparsely by one stray byte far past its end is read in bounded memory.

``f.seek(1 << 30); f.write(b"x")`` on a session file (a stray write, a file
system's recovery) makes a file of 1 GiB that takes a few KiB on disk: its
records, zeros (a hole) and one non-zero byte. Every reader used to read the
whole region up to that byte into memory and scan it (2 bytes of RSS per
byte of the file: a listing of the parent took seconds and GBs; an 8 GiB
extension OOM-killed it). Readers now read the records, then look past them
a bounded window at a time, skipping holes (FORMAT.md §3.4: holes are never
read).

The verdict is the format's: zeros followed by a byte that is not zero are
damage at the start of the zeros (§3.4); no commit point follows it, so the
log has a torn tail (§3.3), and ``fsck --repair`` cuts it (the committed
records stay). Each operation runs in a child process that reports the
growth of its peak RSS (``ru_maxrss``) across the operation alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from subagents import store

from ._support import REPO_ROOT, child_env, make_child

EXTENDED = 1 << 30
# the growth of peak RSS an operation may cause: a few MiB beyond one record of the store's limit
# (16 MiB by default), nowhere near the 2 GiB the whole-file read took
BOUND_KIB = 48 << 10
TURN = [("turn/start", {}), ("assistant/message", {"text": "done"}), ("turn/end", {"stop_reason": "completed"})]
OLD = time.time() - 600


@pytest.fixture
def tree(tmp_path) -> tuple[store.Store, str, str, str, list]:
    """A root with two settled one-shot children; the first one's file extended sparsely to 1 GiB (its
    events before, last)."""
    st = store.Store(tmp_path / "store", durability="none")
    owner = store.new_id()
    store.register_owner(st, owner, ttl=60.0)
    store.create_session(st, "root", created_at=OLD)
    for child in ("damaged", "sibling"):
        make_child(st, "root", child, created_at=OLD, lease_owner=owner)
        with store.LogWriter.open(st, child, epoch=1) as writer:
            writer.append(TURN, commit=True)
        store.release_lease(st, child, owner, 1)
    store.remove_owner(st, owner)
    events = store.inspect(st, "damaged").events
    path = st.session_path("damaged")
    with open(path, "r+b") as handle:
        handle.seek(EXTENDED)
        handle.write(b"x")
    assert os.stat(path).st_blocks * 512 < 1 << 20  # sparse: it costs nothing on disk
    return st, "root", "damaged", "sibling", events


def measured(st: store.Store, body: str) -> dict:
    """Run ``body`` (which sets ``result``) in a child process: its result and the growth of its peak RSS (KiB)."""
    script = textwrap.dedent("""
        import json, sys
        from subagents import store
        from subagents.store.check import check_store
        from subagents.store.fsck import fsck
        st = store.Store(sys.argv[1])
        def peak():  # this process's own peak RSS (KiB): fresh at exec, unlike ru_maxrss, which a child inherits
            with open("/proc/self/status") as status:
                return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
        before = peak()
    """) + textwrap.dedent(body) + textwrap.dedent("""
        grown = peak() - before
        print(json.dumps({"grown_kib": grown, "result": result}, default=str))
    """)
    done = subprocess.run([sys.executable, "-c", script, str(st.root)], capture_output=True, text=True, timeout=300,
                          env=child_env(), cwd=str(REPO_ROOT))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_bounded(found: dict) -> None:
    assert found["grown_kib"] < BOUND_KIB, f"peak RSS grew by {found['grown_kib'] >> 10} MiB"


def test_inspect_reads_a_sparse_extension_as_a_torn_tail_in_bounded_memory(tree):
    st, _root, damaged, sibling, events = tree
    found = measured(st, f"""
        found = store.inspect(st, {damaged!r})
        d = found.damage
        result = [found.status, [e["type"] for e in found.events], found.end, d.offset, d.reason, d.dropped, found.size]
    """)
    assert_bounded(found)
    status, types, end, offset, reason, dropped, size = found["result"]
    assert status == "torn" and types == [e["type"] for e in events]
    assert (offset, reason) == (end, "undecodable")  # zeros, then a byte that is not zero: damage where the zeros start
    data_start = os.path.getsize(st.session_path(damaged)) - size
    assert dropped == EXTENDED + 1 - data_start - end  # up to the stray byte: the hole is no data, but what is dropped
    assert store.inspect(st, sibling).status == "clean"


def test_listing_the_parent_reads_the_siblings_normally_in_bounded_memory(tree):
    st, root, damaged, sibling, _events = tree
    found = measured(st, f"""
        rows = store.list_children(st, {root!r})
        result = [[r.id, r.kind, getattr(r, "status", None), getattr(r, "reason", None)] for r in rows]
        result.append([[r.entry.id, r.depth] for r in store.list_descendants(st, {root!r})])
    """)
    assert_bounded(found)
    *rows, descendants = found["result"]
    by_id = {r[0]: r for r in rows}
    assert set(by_id) == {damaged, sibling} and descendants == [[damaged, 1], [sibling, 1]]
    assert by_id[sibling][1] == "child" and by_id[sibling][2] == "complete"
    assert by_id[damaged][1] == "child"  # a torn tail is no diagnostic: its committed turn is listed


def test_check_store_counts_a_torn_tail_in_bounded_memory(tree):
    st, _root, damaged, _sibling, _events = tree
    found = measured(st, """
        report = check_store(st)
        result = [report.counts.torn_tails, [[v.kind, v.session_id] for v in report.violations]]
    """)
    assert_bounded(found)
    torn, violations = found["result"]
    assert torn == 1
    assert all(session_id == damaged for _kind, session_id in violations), violations


def test_fsck_repair_cuts_the_extension_keeping_the_committed_records(tree):
    st, _root, damaged, sibling, events = tree
    sibling_bytes = open(st.session_path(sibling), "rb").read()
    found = measured(st, """
        report = fsck(st, repair=True, lease_ttl_s=30.0)
        result = [[f["id"], f["kind"], f.get("repaired")] for f in report["findings"]]
    """)
    assert_bounded(found)
    assert [damaged, "torn", True] in found["result"]
    assert all(f[0] == damaged for f in found["result"]), found["result"]
    after = store.inspect(st, damaged)
    assert after.status == "clean" and after.events[: len(events)] == events
    assert os.path.getsize(st.session_path(damaged)) < 1 << 20  # the extension is cut: the stray byte was no record
    assert open(st.session_path(sibling), "rb").read() == sibling_bytes


def test_committed_records_past_a_hole_still_read_as_corruption(tmp_path):
    """The bounded read must not turn corruption into a torn tail (which a resume would cut): a ``turn/end``
    that chains far past a hole after the records is found, a window at a time, as the whole read found it."""
    from subagents.store.framing import encode_record
    st = store.Store(tmp_path / "store", durability="none", max_record_bytes=64 << 10)
    store.create_session(st, "child", created_at=OLD)
    with store.LogWriter.open(st, "child", epoch=0) as writer:
        writer.append(TURN, commit=True)
    before = store.inspect(st, "child")
    data_start = os.path.getsize(st.session_path("child")) - before.size
    seq = before.next_seq
    later = b"".join(encode_record({"seq": seq + i, "ts": 1.0, "type": kind, "data": {}, "epoch": 0})
                     for i, kind in enumerate(("turn/start", "turn/end", "turn/start")))
    with open(st.session_path("child"), "r+b") as handle:
        handle.seek(data_start + before.end + (256 << 20))  # records lost to a hole, then committed ones
        handle.write(later[len(encode_record({"seq": seq, "ts": 1.0, "type": "turn/start", "data": {}, "epoch": 0})):])
    found = store.inspect(st, "child")
    assert found.status == "corrupt" and found.damage.offset == before.end and found.events == before.events
    with pytest.raises(store.CorruptSessionError):
        store.LogWriter.open(st, "child", epoch=0)
