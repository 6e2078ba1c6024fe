"""The kept fold of a children index holds what committed ends need, not every row's records.

A soak probe of a long-lived host (one root, thousands of finished children) saw the host's memory
grow with every child the root ever had: ``store/committed.py`` keeps, for as long as the process
lives, the fold of each children index a cold resume read (up to 256 parents), and that fold held
each child's creation record and its latest settled record as decoded maps, ~1.3 KB a child (4 MB
for a root with 3,100 children) to answer one integer per child. Measured here with ``tracemalloc``:
what one read of a parent's index leaves behind, per child.
"""

from __future__ import annotations

import gc
import tracemalloc

from subagents import store
from subagents.store import committed
from subagents.store.index import add_children, mark_settled
from subagents.store.index_read import IndexEntry, Settled

CHILDREN = 2000


def test_the_kept_fold_costs_little_per_child(st) -> None:
    store.create_session(st, "p")
    ids = [f"c{n}" for n in range(CHILDREN)]
    add_children(st, "p", [IndexEntry(child, 1.0e9 + n, "subagent", "continuable", f"worker {n}") for n, child in enumerate(ids)])
    for n, child in enumerate(ids):
        settled = Settled("completed", None, None, 1.0e9 + n, has_children=False, end=4096 + n, mtime_ns=1_700_000_000_000_000_000 + n)
        mark_settled(st, "p", child, settled)

    gc.collect()
    tracemalloc.start()
    try:
        ends = committed._ends_of(st, "p")
        del ends
        gc.collect()
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert committed._ends_of(st, "p") == {child: 4096 + n for n, child in enumerate(ids)}
    # an id, its end and two table slots are ~200 B; the rows' records were ~1,300 B more
    assert kept / CHILDREN < 400, f"the kept fold holds {kept / CHILDREN:.0f} B per child"  # 1,196 B before
