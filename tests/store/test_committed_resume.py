"""The resume path never cuts a settled child's committed records (``store/committed.py``).

A settled child's last ``turn/end`` changed in place, cut short or zeroed reads like a crash's torn
tail (or an open turn): ``LogWriter.open`` used to cut it and close the turn as interrupted. The
lease is taken before the log is opened, and that marks the child's index row ``active``: the end
its last ``settled`` row gave must still be known then (``IndexEntry.committed_end``). A real torn
tail, past that end (a crash mid-append of a later turn), is still cut.
"""

from __future__ import annotations

import os

import pytest

from subagents import store
from subagents.store import CorruptSessionError, LogWriter

from ..session_bytes import cut_at_record, log_start, patch, zero_records_from
from .test_settled_mtime import TURN, owner, settle  # noqa: F401 - fixture


def _file(st: store.Store, session_id: str) -> bytes:
    with open(st.session_path(session_id), "rb") as handle:
        return handle.read()


def _flip_last_record(st: store.Store, child: str) -> None:
    found = store.inspect(st, child)
    at = log_start(st, child) + found.end - 6
    patch(st, child, at, bytes([_file(st, child)[at] ^ 0xFF]))


def _cut_last_record(st: store.Store, child: str) -> None:
    found = store.inspect(st, child)
    os.truncate(st.session_path(child), log_start(st, child) + found.end - 20)


def _zero_last_record(st: store.Store, child: str) -> None:
    zero_records_from(st, child, -1)


@pytest.mark.parametrize("lose", [_flip_last_record, _cut_last_record, _zero_last_record], ids=["changed", "cut", "zeroed"])
def test_the_resume_path_refuses_a_settled_child_that_lost_its_turn_end(st, owner, lose):  # noqa: F811
    store.create_session(st, "r")
    settle(st, "r", "b", owner, through_writer=True)
    lose(st, "b")
    lease = store.acquire_lease(st, "b", owner)  # the row is `active` from here on
    assert store.read_children(st, "r")[0].settled is None
    log_before = _file(st, "b")[log_start(st, "b"):]
    with pytest.raises(CorruptSessionError):
        LogWriter.open(st, "b", epoch=lease.epoch)
    assert _file(st, "b")[log_start(st, "b"):] == log_before  # nothing cut, no closer appended


def test_a_torn_tail_past_the_settled_end_is_still_cut(st, owner):  # noqa: F811
    store.create_session(st, "r")
    settle(st, "r", "b", owner, through_writer=False)
    lease = store.acquire_lease(st, "b", owner)
    with LogWriter.open(st, "b", epoch=lease.epoch) as writer:
        writer.append(TURN[:2], commit=True)  # a later turn, never ended
    _cut_last_record(st, "b")  # its worker died mid-append
    assert store.inspect(st, "b").status == "torn"
    assert store.read_projection(st, "b").open_turn is not None
    with LogWriter.open(st, "b", epoch=lease.epoch) as writer:
        assert [e["type"] for e in writer.repaired][-1] == "turn/end"
    assert store.inspect(st, "b").status == "clean"


@pytest.mark.parametrize("lose", [_flip_last_record, _cut_last_record], ids=["changed", "cut"])
def test_read_projection_calls_a_lost_turn_end_corrupt(st, owner, lose):  # noqa: F811
    store.create_session(st, "r")
    settle(st, "r", "b", owner, through_writer=True)
    lose(st, "b")
    with pytest.raises(CorruptSessionError):
        store.read_projection(st, "b")


def _zero_last_turn(st: store.Store, child: str) -> None:
    """The whole last turn zeroed, from its ``turn/start``: the log reads clean, with no open turn."""
    events = store.inspect(st, child).events
    zero_records_from(st, child, max(i for i, e in enumerate(events) if e["type"] == "turn/start"))


def _cut_before_turn_end(st: store.Store, child: str) -> None:
    """Cut at the record boundary before the last ``turn/end``: the log reads clean, with an open turn."""
    cut_at_record(st, child, -1)


@pytest.mark.parametrize("lose", [_zero_last_turn, _cut_before_turn_end], ids=["turn zeroed", "cut at a boundary"])
def test_the_resumes_read_compares_a_clean_log_with_its_settled_end(st, owner, lose):  # noqa: F811
    """Found by a probe: neither reads torn, so only a torn log was compared with its row, and a
    resume ran the zeroed turn's message again (or retried a turn whose log would not open, forever).
    The resume's first read (``verify_committed``) compares every log; other readers still pay only for a torn one."""
    store.create_session(st, "r")
    settle(st, "r", "b", owner, through_writer=True)
    assert store.read_projection(st, "b", verify_committed=True).turns == 1
    lose(st, "b")
    assert store.inspect(st, "b").status == "clean"
    with pytest.raises(CorruptSessionError, match="records-missing"):
        store.read_projection(st, "b", verify_committed=True)
