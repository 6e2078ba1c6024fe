"""Audit: a settled child whose *last* committed log record is damaged in place lists as healthy.

65ef1e7 reads a settled child whose file was written since its release, "so bytes of its header or of a
committed log record overwritten in place, same size, now list as a corrupt DiagnosticEntry". The read
judges the log by its torn-tail rule alone: damage with no ``turn/end`` chaining after it is a torn tail.
The last record of a settled child's log is its final ``turn/end``: a byte flipped in it reads as a torn
tail, the child lists as an ordinary row of its prefix (a turn that never ended), not as damaged, though
its row says where its committed records reached (``end``: the damage lies before it) — the very fact the
mailbox's readers use as ``committed_end``. ``check_store`` does find it.
"""

from __future__ import annotations

import pytest

from subagents import store
from subagents.store.check import check_store
from subagents.store.framing import FRAME

from ..session_bytes import log_start
from .test_settled_mtime import flip, settle


@pytest.mark.parametrize("through_writer", [False, True], ids=["release_lease", "log writer"])
def test_a_settled_child_whose_last_record_is_damaged_in_place_lists_as_corrupt(st, through_writer):
    owner = store.new_id()
    store.register_owner(st, owner, ttl=60.0)
    store.create_session(st, "r")
    for child in ("a", "b"):
        settle(st, "r", child, owner, through_writer=through_writer)
    before = store.list_children(st, "r")
    assert [r.kind for r in before] == ["child", "child"]
    found = store.inspect(st, "b")
    [last] = [i for i, e in enumerate(found.events) if e["type"] == "turn/end"]
    assert last == len(found.events) - 1
    flip(st, "b", log_start(st, "b") + found.offsets[last] + FRAME.size + 4)
    assert not check_store(st).clean  # check finds it (its row and its log disagree)
    assert store.list_children(st, "r") == [before[0], store.DiagnosticEntry("b", "corrupt")]
