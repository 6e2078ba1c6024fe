"""The kept fold of a children index says which children are listed, with their origin and mode, as a
whole read would.

A drain of a few named children asked which of them the parent lists and whether each is continuable,
and learned it from a listing of all of them: every record of the index decoded, on every drain
(~25 µs and ~1.4 KB a child the parent ever had, found by a probe). ``committed.listed_rows`` answers
from the fold ``store/committed.py`` keeps and reads on; each step here compares it with a careful
whole read, and a first read folds the file 256 KB and a few hundred records at a time.
"""

from __future__ import annotations

import gc
import os
import tracemalloc

from subagents import store
from subagents.store import committed
from subagents.store.index import add_children, mark_active, mark_settled, remove_child
from subagents.store import index_read
from subagents.store.index_read import IndexEntry, Listed, Settled

KINDS = [("subagent", "continuable"), ("subagent", "one-shot"), ("subagent", None), (None, None), ("user", "continuable")]


def _whole(st: store.Store, parent: str, ids: list[str]) -> dict[str, Listed]:
    return {e.id: Listed(e.origin == "subagent", e.mode) for e in store.read_index(st, parent).entries if e.id in ids}


def _add(st: store.Store, parent: str, first: int, count: int) -> list[str]:
    ids = [f"c{first + n}" for n in range(count)]
    add_children(st, parent, [IndexEntry(child, 1.0e9 + first + n, *KINDS[(first + n) % len(KINDS)]) for n, child in enumerate(ids)])
    for n, child in enumerate(ids):
        mark_settled(st, parent, child, Settled("completed", None, None, 1.0e9 + n, has_children=False, end=4096 + n))
    return ids


def test_listed_rows_answer_as_a_whole_read_through_appends_tombstones_and_damage(st) -> None:
    store.create_session(st, "p")
    ids = _add(st, "p", 0, 600)  # more records than one batch of the fold
    asked = [*ids[::7], "c-unknown"]
    assert committed.listed_rows(st, "p", asked) == _whole(st, "p", asked)

    ids += _add(st, "p", 600, 10)  # appended: read on
    remove_child(st, "p", "c7")  # a creation rolled back: no longer listed
    mark_active(st, "p", "c10")
    asked = [*ids[::7], "c10", "c603"]
    found = committed.listed_rows(st, "p", asked)
    assert found == _whole(st, "p", asked)
    assert "c7" not in found and found["c10"] == Listed(True, "continuable") and found["c603"] == Listed(False, None)

    path = st.children_index_path("p")
    ids += _add(st, "p", 610, 300)  # read on over a batch and more, then damage: what it folded is dropped
    with open(path, "ab") as handle:
        handle.write(b"\x05\x00\x00\x00garbage")  # a record in flight, or damage: the caller reads it the careful way
    assert committed.listed_rows(st, "p", asked) is None
    os.truncate(path, os.path.getsize(path) - 11)  # the append finished as nothing: clean again, read from its start
    asked = [*ids[::7], "c10", "c603"]
    assert committed.listed_rows(st, "p", asked) == _whole(st, "p", asked)


def _first_read(st: store.Store, parent: str, child: str) -> tuple[dict[str, Listed] | None, int, int]:
    """A first ``listed_rows`` of the parent's index: (its answer, what the read held meanwhile beside
    what it keeps, what it keeps), per ``tracemalloc``."""
    gc.collect()
    tracemalloc.start()
    try:
        found = committed.listed_rows(st, parent, [child])
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return found, peak - kept, kept


def test_a_first_read_holds_neither_the_file_nor_its_records_whole(st) -> None:
    sizes = {"small": 2000, "large": 8000}
    reads = {}
    for name, children in sizes.items():
        store.create_session(st, name)
        ids = _add(st, name, 0, children)
        reads[name] = _first_read(st, name, ids[0])
        assert reads[name][0] == {"c0": Listed(True, "continuable")}
        assert committed.listed_rows(st, name, ids) == _whole(st, name, ids)
        assert committed._ends_of(st, name) == {e.id: e.committed_end for e in store.read_index(st, name).entries}
    grown = os.path.getsize(st.children_index_path("large")) - os.path.getsize(st.children_index_path("small"))
    assert grown > 3 * index_read._CHUNK  # read in parts, records across them
    (_, small, _), (_, large, kept) = reads["small"], reads["large"]
    # besides the fold it keeps (~200 B a child), a read holds a part of the file, a batch of records, and the
    # fold's tables while they grow (~40 B a child): here +300 KB from 2,000 children to 8,000. Holding the
    # file's bytes whole added their ~1 MB (+980 KB); its records decoded all at once, ~1 KB a child more
    assert large - small < grown / 2, f"a first read held {small} B beside what it keeps for 2,000 children, {large} B for 8,000"
    assert kept / sizes["large"] < 300, f"the kept fold holds {kept / sizes['large']:.0f} B a child"
