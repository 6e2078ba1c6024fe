"""Draining one named child reads the parent's children index on from where the last read stopped.

A probe of a long-lived host found each ``drain_children`` of a child nobody hosts costing ~1.4 KB of
memory and ~25 µs of CPU per child its parent ever had: which named children exist under the parent,
and whether they are continuable, was learned by decoding every record of the parent's children
index, whole, on every drain (single-child drains went from 6.7 to 55 ms as a store grew to a few
thousand children). Measured here with the kernel's count of bytes this process read
(``/proc/self/io``, ``rchar``) and ``tracemalloc``'s peak, at two sizes of the parent's index: a
drain of the same child must cost the same at both.
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from pathlib import Path

import pytest

from subagents.store import Store
from subagents.store.index import add_children, mark_active, mark_settled
from subagents.store.index_read import IndexEntry, Settled
from subagents.supervisor import Supervisor

from .test_continuable import S, continuable_supervisor, settled_all, start
from .test_drain import discarded, left_by_a_closed_host

pytestmark = pytest.mark.anyio

if not Path("/proc/self/io").exists():
    pytest.skip("needs /proc/self/io (Linux)", allow_module_level=True)


def _read_bytes() -> int:
    """What this process has read so far, per the kernel (every thread)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def _more_siblings(st: Store, parent: str, first: int, count: int) -> None:
    """``count`` settled continuable children of ``parent`` in its index, as their creations and releases
    append them (a creation record with the row's static fields, ``active``, then ``settled``)."""
    ids = [f"sibling-{first + n}" for n in range(count)]
    add_children(st, parent, [IndexEntry(child, 1.0e9 + first + n, "subagent", "continuable", f"worker {first + n}")
                              for n, child in enumerate(ids)])
    for n, child in enumerate(ids):
        mark_active(st, parent, child)
        mark_settled(st, parent, child, Settled("completed", None, None, 1.0e9 + n, has_children=False, end=4096 + n,
                                                mtime_ns=1_700_000_000_000_000_000 + n))


async def _drain_cost(sup: Supervisor, root: str, target: str) -> tuple[int, int]:
    """(bytes read, tracemalloc peak) of one ``drain_children`` of ``target``."""
    gc.collect()
    tracemalloc.start()
    try:
        before = _read_bytes()
        await sup.drain_children(root, [target])
        read = _read_bytes() - before
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return read, peak


async def test_a_drain_of_one_child_costs_the_same_whatever_its_siblings(tmp_path) -> None:
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root()
        target, _ = await start(sup, root, S({"return": "done"}))
        await settled_all(sup, root, [target])
        await sup.drain_children(root, [target])  # the first drain of it: what it leaves is read once

        _more_siblings(sup.store, root.id, 0, 300)
        await sup.drain_children(root, [target])  # reads on past the siblings just appended
        small = await _drain_cost(sup, root, target)
        _more_siblings(sup.store, root.id, 300, 900)
        await sup.drain_children(root, [target])
        large = await _drain_cost(sup, root, target)

    # 300 siblings' records are ~100 KB of index and ~400 KB decoded: the same drain with 1,200 of
    # them must not read or hold more than with 300 (a margin for what the supervisor's own threads do)
    assert large[0] < small[0] + 32 * 1024, f"bytes read per drain: {small[0]} with 300 siblings, {large[0]} with 1,200"
    assert large[1] < small[1] + 64 * 1024, f"tracemalloc peak per drain: {small[1]} with 300 siblings, {large[1]} with 1,200"


async def test_a_drain_beside_a_damaged_index_reads_it_past_the_damage_and_says_so(tmp_path, caplog) -> None:
    """An index that does not read clean is read as a listing reads it: the damaged record skipped and
    logged (run reindex), the named child found all the same, and what a closed host left it discarded."""
    root_id, running, queued, _ = await left_by_a_closed_host(tmp_path)
    st = Store(tmp_path / "store", create=False)
    path = st.children_index_path(root_id)
    before = os.path.getsize(path)
    _more_siblings(st, root_id, 0, 20)
    with open(path, "r+b") as handle:  # a byte of a sibling's record, in the middle of the file, changed
        handle.seek((before + os.path.getsize(path)) // 2)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0xFF]))
    async with continuable_supervisor(tmp_path) as second:
        root = await second.open_root(id=root_id)
        await second.drain_children(root, [running])
        assert discarded(second.store, running) == [queued]
    assert any("run `subagents store reindex`" in r.getMessage() and root_id in r.getMessage() for r in caplog.records)
