"""A first read of one parent's large children index holds up no other parent's kept fold.

``store/committed.py`` keeps each parent's index fold and reads on from where its last read stopped;
one lock covered every parent's fold, so the first read of a root's index with hundreds of thousands
of records (seconds) stalled every other parent's cold resume and drain meanwhile (found by reading
the code). Each parent's fold now has its own lock: readers of one parent still take turns, so the
second reads on from where the first stopped.
"""

from __future__ import annotations

import os
import threading
import time

from subagents import store
from subagents.store import committed
from subagents.store.framing import encode_record
from subagents.store.index import add_children, mark_settled
from subagents.store.index_read import IndexEntry, Settled

BIG = 300_000  # records: a first read of them takes seconds on this machine, the small one milliseconds


def _big_index(st: store.Store, parent: str) -> None:
    """An index of ``BIG`` creation records, written in its format at once (appending them one by one
    through the store costs a lock and a write each)."""
    store.create_session(st, parent)
    path = st.children_index_path(parent)
    blob = b"".join(encode_record({"seq": n, "id": f"b{n}", "created_at": 1.0e9 + n, "origin": "subagent",
                                   "mode": "one-shot"}) for n in range(BIG))
    with open(path, "ab") as handle:
        handle.write(blob)


def test_a_first_read_of_a_large_index_does_not_hold_up_another_parent(st) -> None:
    _big_index(st, "big")
    store.create_session(st, "small")
    add_children(st, "small", [IndexEntry("s0", 1.0e9, "subagent", "continuable")])
    mark_settled(st, "small", "s0", Settled("completed", None, None, 1.0e9, has_children=False, end=4096))

    big_done = threading.Event()
    found: dict[str, object] = {}

    def read_big() -> None:
        found["big"] = committed.listed_rows(st, "big", ["b0", f"b{BIG - 1}"])
        big_done.set()

    reader = threading.Thread(target=read_big)
    reader.start()
    try:
        time.sleep(0.05)  # the big read is under way (it takes seconds)
        assert not big_done.is_set(), "the large index read too fast to show anything; make it larger"
        small = committed.listed_rows(st, "small", ["s0"])
        assert not big_done.is_set(), "the small parent's fold waited for the large parent's first read"
        assert small == {"s0": committed.listed_rows(st, "small", ["s0"])["s0"]} and small["s0"].mode == "continuable"
    finally:
        reader.join(60)
    assert found["big"] is not None and set(found["big"]) == {"b0", f"b{BIG - 1}"}


def test_concurrent_readers_of_one_parent_each_get_the_whole_answer(st) -> None:
    _big_index(st, "big")
    answers: list[object] = []
    threads = [threading.Thread(target=lambda: answers.append(committed.listed_rows(st, "big", [f"b{BIG - 1}"])))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(answers) == 3 and all(a is not None and set(a) == {f"b{BIG - 1}"} for a in answers)
    os.truncate(st.children_index_path("big"), 0)  # cut: the kept fold is not believed
    assert committed.listed_rows(st, "big", ["b0"]) == {}


def test_the_per_index_locks_live_no_longer_than_their_folds(st) -> None:
    """A lock per parent ever asked would grow with every parent; they go with their folds."""
    for n in range(committed._FOLDED_MAX + 40):
        store.create_session(st, f"p{n}")
        add_children(st, f"p{n}", [IndexEntry(f"p{n}c", 1.0e9, "subagent", "one-shot")])
        assert committed.listed_rows(st, f"p{n}", [f"p{n}c"]) is not None
        assert committed.listed_rows(st, f"missing{n}", ["x"]) is None  # no index: nothing kept
    assert len(committed._READING) <= committed._FOLDED_MAX
