"""A seed given to ``create_session`` is checked as an append checks its events, before anything is written.

Found by a probe of forks: a seed event of a type this build does not read
(or one a newer writer marked ``ignorable``, whose mark was dropped) made a
session that ``inspect`` and ``store check`` then refused; a ``type`` that was
no string made a log that read as a torn tail; a missing ``type`` or an event
that was no map raised a bare ``KeyError`` / ``AttributeError``; an envelope
key the log does not have (``surfaceOp``, a typo) and a ``seq`` out of order
were dropped without a word.
"""

from __future__ import annotations

from typing import Any

import pytest

from subagents import store
from subagents.store import InvalidRecordError, check_store, create_session, inspect, new_id, read_header

TURN = [{"type": "turn/start", "data": {"message_id": "m1"}}, {"type": "turn/end", "data": {"stop_reason": "completed", "diagnostic": None}}]


@pytest.fixture
def st(tmp_path) -> store.Store:
    return store.Store(tmp_path / "store")


def make_child(st: store.Store, seed: list[Any]) -> str:
    root = new_id()
    create_session(st, root)
    child = new_id()
    create_session(st, child, parent_session=root, seed=seed)
    return child


def _refused(st: store.Store, seed: list[Any]) -> str:
    """What creating a child with ``seed`` was refused with (``INVALID_RECORD``), having checked it left nothing."""
    root = new_id()
    create_session(st, root)
    child = new_id()
    with pytest.raises(InvalidRecordError) as caught:
        create_session(st, child, parent_session=root, seed=seed)
    assert caught.value.code == "INVALID_RECORD"
    assert not st.exists(child)
    assert store.list_children(st, root) == []
    assert not check_store(st).violations
    return str(caught.value)


@pytest.mark.parametrize(
    ("seed", "problem"),
    [
        ([{"data": {}}], "type must be a string, not NoneType"),
        ([{"type": 3, "data": {}}], "type must be a string, not int"),
        (["turn/start"], "an event is a map, not str"),
        ([{"type": "assistant/message", "data": {}, "surfaceOp": {"op": "replace"}}], "unknown key 'surfaceOp'"),
        ([{"type": "assistant/message", "data": {}, "seq": 5}], "seq must be 0 (a seed's events are contiguous from 0), not 5"),
        ([{"type": "assistant/message", "data": {}, "ts": "noon"}], "ts must be a finite number"),
        ([{"type": "assistant/message", "data": {}, "ignorable": 1}], "ignorable must be a boolean"),
        ([*TURN, {"type": "x/newer", "data": {}}], 'event type "x/newer" is not one this build reads'),
    ],
)
def test_a_seed_a_reader_would_refuse_is_refused_and_nothing_is_made(st: store.Store, seed: list[Any], problem: str) -> None:
    refusal = _refused(st, seed)
    assert refusal.startswith(f"seed event {len(seed) - 1} cannot be stored: ")
    assert problem in refusal


def test_an_ignorable_seed_event_keeps_its_mark_and_the_session_reads(st: store.Store) -> None:
    child = make_child(st, [{"type": "x/newer", "data": {"n": 1}, "ignorable": True}, *TURN])
    events = inspect(st, child).events
    assert read_header(st, child).seed_length == 3
    assert events[0]["type"] == "x/newer" and events[0].get("ignorable") is True
    assert not check_store(st).violations


def test_a_seed_copied_with_its_seqs_and_epochs_is_renumbered_as_written(st: store.Store) -> None:
    seed = [{**event, "seq": i, "epoch": 3, "ts": 1.5} for i, event in enumerate(TURN)]
    child = make_child(st, seed)
    events = inspect(st, child).events
    assert [(e["seq"], e["epoch"], e["ts"], e["type"]) for e in events] == [(0, 0, 1.5, "turn/start"), (1, 0, 1.5, "turn/end")]
    assert not check_store(st).violations


@pytest.mark.parametrize(
    ("seed", "open_at"),
    [
        ([{"type": "turn/start", "data": {"message_id": "m1"}}], 0),
        ([*TURN, {"type": "turn/start", "data": {"message_id": "m2"}}, {"type": "step/start", "data": {}}], 2),
    ],
)
def test_a_seed_that_ends_inside_an_open_turn_is_refused_and_nothing_is_made(st: store.Store, seed: list[Any], open_at: int) -> None:
    """A seed ending after a ``turn/start`` with no ``turn/end`` made a session that read as running a turn nobody
    ran (found by a probe; its projection had ``open_turn`` set from its creation). A fork's prefix ends at its
    source's last ``turn/end`` (the fork tests), so only a hand-made seed is refused."""
    assert _refused(st, seed) == (f"seed event {open_at} cannot be stored: the seed ends inside an open turn "
                                  "(this turn/start has no turn/end): a seed ends between turns")
