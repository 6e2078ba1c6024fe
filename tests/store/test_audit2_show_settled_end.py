"""Audit (084acb6): ``show`` and ``ls`` disagree about a settled child that lost its last committed records.

084acb6 makes ``describe_session`` (``subagents show``) compare the log's valid end with the ``end`` its
settled row records, "as ls lists it". But it compares only when the log reads ``torn``
(``lost_committed``: ``found.status != "torn"`` returns early), while the listing compares whatever the
status (``catalog._row``'s ``committed_end``) and calls a file shorter than the row's ``end`` damaged
(``_since_settled``: ``cut``). A settled child whose final ``turn/end`` is gone *whole* reads ``clean``:

* zeroed in place (the record's bytes are zeros, as a file system that loses a block's data after a crash
  leaves them): the zeros read as the log's padding;
* cut at the record's start (a file truncated to a record boundary).

Both lost a committed record its row says was written. ``ls`` lists the child as a ``corrupt``
diagnostic and ``check`` flags its row; ``show`` describes it as a healthy log whose last turn never
ended (exit 0), the very disagreement 084acb6 set out to remove.
"""

from __future__ import annotations


import pytest

from subagents import store

from ..session_bytes import cut_at_record, zero_records_from
from .test_settled_mtime import owner, settle  # noqa: F401 - fixture


def _zero_last_record(st: store.Store, child: str) -> None:
    zero_records_from(st, child, -1)


def _cut_at_last_record(st: store.Store, child: str) -> None:
    cut_at_record(st, child, -1)


@pytest.mark.parametrize("lose", [_zero_last_record, _cut_at_last_record], ids=["zeroed", "cut"])
def test_show_says_corrupt_where_ls_does_for_a_settled_child_that_lost_its_last_record(st, owner, lose):  # noqa: F811
    store.create_session(st, "r")
    settle(st, "r", "b", owner, through_writer=True)
    assert store.inspect(st, "b").events[-1]["type"] == "turn/end"
    lose(st, "b")

    assert store.inspect(st, "b").status == "clean"  # the lost record is not damage to the log's own rules
    assert store.list_children(st, "r") == [store.DiagnosticEntry("b", "corrupt")]  # the row says it is
    assert store.describe_session(st, "b").inspection.status == "corrupt"  # show must say what ls says
