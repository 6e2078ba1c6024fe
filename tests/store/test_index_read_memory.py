"""What a read of a children index holds while it folds: the entries it returns, not the index's records.

A listing reads its parent's whole index each time. Folded from every decoded record of the file at once
(each record a dict, kept while the entries were built), a read held ~1.4 KB beside its result for every
child the parent ever had: a root with 100,000 children took ~140 MB per listing (found by measuring
``benchmarks/catalog_scale.py``'s family with ``tracemalloc``).
"""

from __future__ import annotations

import gc
import tracemalloc

from subagents import store
from subagents.store.index import add_children, mark_settled
from subagents.store.index_read import IndexEntry, Settled

CHILDREN = 3000


def test_a_read_of_a_clean_index_holds_little_beside_its_entries(st) -> None:
    store.create_session(st, "p")
    ids = [f"c{n}" for n in range(CHILDREN)]
    add_children(st, "p", [IndexEntry(child, 1.0e9 + n, "subagent", "one-shot", f"task {n}") for n, child in enumerate(ids)])
    for n, child in enumerate(ids):
        mark_settled(st, "p", child, Settled("completed", None, None, 1.0e9 + n, has_children=False, end=4096 + n, mtime_ns=n))
    store.read_index(st, "p")
    gc.collect()
    tracemalloc.start()
    try:
        found = store.read_index(st, "p")
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not found.problems and [e.id for e in found.entries] == ids
    assert found.entries[5] == IndexEntry("c5", 1.0e9 + 5, "subagent", "one-shot", "task 5",
                                          Settled("completed", None, None, 1.0e9 + 5, False, 4101, 5), 4101)
    # beside the entries it returns, the read held less than half as much again (its records, whole: more than all of them)
    assert peak - kept < kept / 2, (peak - kept, kept)
