"""``store reindex`` killed right after each of its changes, then a power loss: every children index is
the old file or the rebuilt one, and the next reindex ends where an uninterrupted one does.

A reindex replaces one parent's index at a time (a new file renamed over the old, or the old one
removed when no child is left: both durable before the next parent), each under that index's lock.
Each copy of a store with three damaged indexes is reindexed by a process that SIGKILLs itself
right after its N-th change (``SUBAGENTS_REINDEX_KILL_AFTER``); another program's files then take
whatever inodes the kills freed, and the power goes (the harness of ``_power_loss.py``, then the
boot's ``e2fsck -p``). The processes are forked from one driver (one interpreter start).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from subagents import store
from subagents.store.fsck import fsck

from ._killed import run_killed_after
from ._power_loss import LoopFs, after_power_loss, run
from .test_power_loss_rewrites import corrupt_record, other_files

OLD = {"p": ["c0", "c2"], "q": ["d0", "d1", "ghost"], "r": ["e"]}  # what each damaged index lists
NEW = {"p": ["c0", "c1", "c2"], "q": ["d0", "d1"], "r": None}  # after a reindex (r: no index at all)


def template(path: Path) -> None:
    """Three roots whose indexes a reindex must rebuild: ``p``'s entry of ``c1`` damaged (readers skip
    it), ``q`` listing ``ghost`` whose file is gone, ``r`` listing only ``e`` whose file is gone."""
    st = store.Store(str(path))
    for parent, kids in (("p", ["c0", "c1", "c2"]), ("q", ["d0", "d1", "ghost"]), ("r", ["e"])):
        store.create_session(st, parent)
        for kid in kids:
            store.create_session(st, kid, parent_session=parent)
    corrupt_record(path / "index" / "children" / "p", 1)
    for gone in ("ghost", "e"):
        os.unlink(st.session_path(gone))


def listed(st: store.Store, parent: str) -> list[str] | None:
    if not os.path.lexists(st.children_index_path(parent)):
        return None
    return [e.id for e in store.read_children(st, parent)]


def test_a_reindex_killed_after_any_change_then_a_power_loss_is_finished_by_the_next(disk: LoopFs, tmp_path: Path) -> None:
    template(tmp_path / "template")
    reference = tmp_path / "reference"
    shutil.copytree(tmp_path / "template", reference)
    store.reindex(store.Store(str(reference), create=False))
    assert {p: listed(store.Store(str(reference), create=False), p) for p in NEW} == NEW
    jobs = []
    for n in range(1, 5):  # three parents: a kill after each change, and a run that finishes
        shutil.copytree(tmp_path / "template", disk.mount / f"k{n}" / "store")
        jobs.append((disk.mount / f"k{n}" / "store", n))
    run("sync", "-f", str(disk.mount))
    died = run_killed_after(jobs, imports="from subagents import store\nfrom subagents.store.index import KILL_AFTER_ENV",
                            call="store.reindex(store.Store(path, create=False))")
    assert [died[str(p)] for p, _ in jobs] == [9, 9, 9, None], died
    other_files(disk, 8)  # another program takes whatever the kills freed
    with after_power_loss(disk, "checked.img", "-p", writable=True) as mount:
        for _, n in jobs:
            st = store.Store(str(mount / f"k{n}" / "store"), create=False)
            for i, parent in enumerate(sorted(NEW)):
                now = listed(st, parent)
                expected = NEW[parent] if i < n else OLD[parent]
                assert now == expected, (n, parent, now)
            store.reindex(st)
            assert {p: listed(st, p) for p in NEW} == NEW, n
            kinds = {f["kind"] for f in fsck(st, repair=False, lease_ttl_s=5.0)["findings"]}
            assert not kinds & {"index-damaged", "index-stale", "index-missing", "interrupted-write"}, (n, kinds)
