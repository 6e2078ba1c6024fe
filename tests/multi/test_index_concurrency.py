"""The shared children index and the catalog under concurrent creators in several processes.

Several host processes start one-shot children at once (released together
by a barrier file): each under one shared parent and under its own root.
Meanwhile this process lists the shared parent again and again. Afterwards
each index is complete (every created child, nothing else), holds each
child exactly once, is ordered by (created_at, id), equals what ``reindex``
rebuilds from headers alone, and every listing seen during the creation was
a subsequence of the final one (a listed child never disappears or moves).
"""

from __future__ import annotations

import threading
import time


from subagents.store import Store, list_children, read_children, reindex, scan


HOSTS = 4
PER_BURST = 30


def is_subsequence(part: list[str], whole: list[str]) -> bool:
    it = iter(whole)
    return all(x in it for x in part)


def raw_records(st: Store, parent: str) -> list[dict]:
    with open(st.children_index_path(parent), "rb") as handle:
        found = scan(handle.read())
    assert found.damage is None, found.damage
    return found.records


def test_concurrent_creators_keep_the_index_complete_unique_ordered_and_rebuildable(tmp_path, hosts) -> None:
    """N hosts × (a shared parent + their own root) at once: complete, no duplicates, stable order, == reindex."""
    st = Store(tmp_path / "store", durability="none")
    running = [hosts.start(st.root, durability="none") for _ in range(HOSTS)]
    shared = running[0].call("open_root", label="shared")
    own = [host.call("open_root", label=f"own{i}") for i, host in enumerate(running)]
    barrier = tmp_path / "go"
    calls = []
    for host, root in zip(running, own):
        calls.append((host, host.send("burst", parent=shared, count=PER_BURST, concurrency=6, barrier=str(barrier))))
        calls.append((host, host.send("burst", parent=root, count=PER_BURST, concurrency=6, barrier=str(barrier))))

    snapshots: list[list[str]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            snapshots.append([e.id for e in list_children(st, shared)])
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    barrier.touch()
    try:
        made = [host.reply(call_id, timeout=120) for host, call_id in calls]
    finally:
        stop.set()
        watcher.join()
    under_shared = sorted(cid for i, ids in enumerate(made) if i % 2 == 0 for cid in ids)
    under_own = {root: sorted(made[2 * i + 1]) for i, root in enumerate(own)}
    assert len(under_shared) == HOSTS * PER_BURST == len(set(under_shared))

    parents = {shared: under_shared, **under_own}
    listed = {parent: [e.id for e in read_children(st, parent)] for parent in parents}
    for parent, expected in parents.items():
        ids = listed[parent]
        assert sorted(ids) == expected, parent  # complete, and nothing else
        # creation entries only: a release appends its child's settled row (FORMAT.md §9), not a creation
        records = [r for r in raw_records(st, parent) if not r.get("removed") and "state" not in r]
        assert sorted(r["id"] for r in records) == expected  # each creation appended exactly once
        entries = read_children(st, parent)
        assert [(e.created_at, e.id) for e in entries] == sorted((e.created_at, e.id) for e in entries)
        catalog = list_children(st, parent)
        assert [e.id for e in catalog] == ids and {e.status for e in catalog} == {"complete"}

    final = listed[shared]
    assert len(snapshots) > 1
    for seen in snapshots:
        assert is_subsequence(seen, final), "a listing during creation is not a subsequence of the final order"

    report = reindex(st)
    assert report.left_out == {} and report.put_back == {}  # every child was acknowledged and listed
    rebuilt = report.parents
    for parent in parents:
        assert rebuilt[parent] == listed[parent], parent  # the derived index equals the rebuild from headers
        assert [e.id for e in read_children(st, parent)] == listed[parent]
    assert set(rebuilt) == set(parents)
