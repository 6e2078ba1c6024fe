"""The kept fold of a children index says which children are listed, with their origin and mode, as a
whole read would.

A drain of a few named children asked which of them the parent lists and whether each is continuable,
and learned it from a listing of all of them: every record of the index decoded, on every drain
(~25 µs and ~1.4 KB a child the parent ever had, found by a probe). ``committed.listed_rows`` answers
from the fold ``store/committed.py`` keeps and reads on; each step here compares it with a careful
whole read, and a first read folds the file a few hundred records at a time.
"""

from __future__ import annotations

import gc
import os
import tracemalloc

from subagents import store
from subagents.store import committed
from subagents.store.index import add_children, mark_active, mark_settled, remove_child
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


def test_a_first_read_never_holds_every_record_decoded(st) -> None:
    store.create_session(st, "p")
    children = 2000
    ids = _add(st, "p", 0, children)
    gc.collect()
    tracemalloc.start()
    try:
        found = committed.listed_rows(st, "p", ids[:1])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found == {"c0": Listed(True, "continuable")}
    # the file's bytes (~250 B a child here) and the kept fold (~200 B); every record decoded at once was ~1 KB more
    assert peak / children < 700, f"a first read peaked at {peak / children:.0f} B per child"
