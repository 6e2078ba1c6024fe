"""Projections: the reference's timing rules (docs/behaviour.md, "Timing"), counters, and the identity cache record."""

from __future__ import annotations

from subagents.store.projection import decode_cache

import msgpack
import pytest

from subagents import store
from subagents.store.projection import PROJECTION_VERSION, Projection

from ._support import CONTINUABLE, ONE_SHOT, event, read_file


def fold(*steps, seed_length=0):
    """steps: (kind, ts) or (kind, ts, data)."""
    p = Projection(seed_length=seed_length)
    for seq, step in enumerate(steps):
        kind, ts, *rest = step
        p.apply(event(seq, kind, rest[0] if rest else None, ts=ts), seq * 10, seq * 10 + 10)
    return p


DESC = ("subagent/descriptor", 1.0, ONE_SHOT)


def test_turn_start_opens_active_and_events_advance_it():
    """After a descriptor, turn/start opens {since: t, through: t}; later events advance through."""
    p = fold(DESC, ("turn/start", 2.0))
    assert (p.timing.active_since, p.timing.active_through, p.timing.settled_ms) == (2.0, 2.0, 0.0)
    p = fold(DESC, ("turn/start", 2.0), ("assistant/message", 3.5), ("tool/call", 4.0, {"call_id": "c"}))
    assert (p.timing.active_since, p.timing.active_through) == (2.0, 4.0)


def test_turn_end_adds_the_elapsed_time():
    """turn/end adds max(0, end - since) in ms and closes the active window."""
    p = fold(DESC, ("turn/start", 2.0), ("turn/end", 3.5), ("turn/start", 10.0), ("turn/end", 10.25))
    assert p.timing.settled_ms == pytest.approx(1750.0)
    assert p.timing.active_since is None and p.timing.active_through is None
    backwards = fold(DESC, ("turn/start", 5.0), ("turn/end", 4.0))
    assert backwards.timing.settled_ms == 0.0


def test_every_descriptor_resets_settled_time():
    """A new descriptor resets the settled milliseconds to 0."""
    p = fold(DESC, ("turn/start", 2.0), ("turn/end", 4.0))
    assert p.timing.settled_ms == 2000.0
    p = fold(DESC, ("turn/start", 2.0), ("turn/end", 4.0), ("subagent/descriptor", 5.0, CONTINUABLE))
    assert p.timing.settled_ms == 0.0
    p = fold(DESC, ("turn/start", 2.0), ("turn/end", 4.0), ("subagent/descriptor", 5.0, CONTINUABLE),
             ("turn/start", 6.0), ("turn/end", 6.5))
    assert p.timing.settled_ms == 500.0


def test_turns_before_any_descriptor_are_ignored():
    """A turn that starts and ends before the first descriptor adds nothing."""
    p = fold(("turn/start", 1.0), ("assistant/message", 2.0), ("turn/end", 4.0))
    assert p.timing.to_record() == {"settled_ms": 0.0, "active_since": None, "active_through": None, "pending_since": None}
    p = fold(("turn/start", 1.0), ("turn/end", 4.0), DESC)
    assert p.timing.settled_ms == 0.0 and p.timing.active_since is None


def test_descriptor_promotes_a_pending_turn_start():
    """A one-shot descriptor written inside the first turn makes that turn active from its start."""
    p = fold(("turn/start", 1.0), ("subagent/descriptor", 2.0, ONE_SHOT))
    assert (p.timing.active_since, p.timing.active_through, p.timing.pending_since) == (1.0, 2.0, None)
    p = fold(("turn/start", 1.0), ("subagent/descriptor", 2.0, ONE_SHOT), ("assistant/message", 3.0), ("turn/end", 4.0))
    assert p.timing.settled_ms == 3000.0


def test_counters_and_open_state():
    """turns, stop reason, consumed messages and open turn/step/calls follow the events."""
    p = fold(DESC, ("message/accepted", 2.0, {"message_id": "m1"}), ("turn/start", 2.0), ("step/start", 2.0),
             ("tool/call", 2.0, {"call_id": "a"}), ("tool/call", 2.0, {"call_id": "b"}), ("tool/result", 2.0, {"call_id": "a"}))
    assert (p.open_turn, p.open_step, p.open_calls) == (2, 3, {"b": 5})
    assert (p.consumed, p.last_message_id, p.turns) == (1, "m1", 0)
    p.apply(event(7, "turn/end", {"stop_reason": "budget-exhausted"}, ts=3.0), 70, 80)
    assert (p.open_turn, p.open_step, p.open_calls, p.turns, p.last_stop_reason) == (None, None, {}, 1, "budget-exhausted")
    assert (p.seq, p.next_seq, p.last_offset, p.end_offset, p.last_ts) == (7, 8, 70, 80, 3.0)


def test_record_roundtrip_and_rejections():
    """to_record/from_record round-trip any state; another version or a broken record is no cache."""
    for p in (Projection(), fold(DESC, ("turn/start", 2.0), ("tool/call", 3.0, {"call_id": "x"})),
              fold(("subagent/descriptor", 1.0, {"version": 1, "mode": "one-shot"})),
              fold(("subagent/descriptor", 1.0, {"version": 7}), seed_length=3)):
        record = p.to_record()
        assert record["version"] == PROJECTION_VERSION
        assert Projection.from_record(msgpack.unpackb(msgpack.packb(record))) == p
    good = fold(DESC).to_record()
    for bad in ({**good, "version": 1}, {**good, "version": 3}, {**good, "timing": None}, {k: v for k, v in good.items() if k != "seq"},
                {**good, "identity": {"version": 1, "mode": "bad"}}, [good], None):
        assert Projection.from_record(bad) is None


def test_a_trusted_record_rebuilds_the_same_projection():
    """Issue #12, item 3: ``from_trusted_record`` (a turn's ``log_state``) gives what ``from_record``
    gives for every state, a continuable descriptor and an open turn on a node included."""
    node = event(3, "turn/start", {"node": "h:1"}, ts=4.0)
    continuable = fold(("subagent/descriptor", 1.0, CONTINUABLE), ("message/accepted", 2.0, {"message_id": "m", "mailbox_end": 9}),
                       ("sandbox/mode", 3.0, {"mode": "read-only"}))
    continuable.apply(node, 30, 40)
    for p in (Projection(), fold(DESC, ("turn/start", 2.0), ("tool/call", 3.0, {"call_id": "x"})),
              fold(DESC, ("turn/start", 2.0), ("turn/end", 3.0, {"stop_reason": "error", "diagnostic": "d", "cause": "c"})),
              fold(("subagent/descriptor", 1.0, {"version": 7}), seed_length=3), continuable):
        record = msgpack.unpackb(msgpack.packb(p.to_record()))
        assert Projection.from_trusted_record(record) == Projection.from_record(record) == p


def test_cache_record_of_a_real_session(st):
    """The identity file holds to_record of the writer's projection, with real timing (a log of
    at least CACHE_LAG_BYTES: a shorter one has no cache)."""
    store.create_session(st, "s1", events=[("subagent/descriptor", CONTINUABLE)])
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        (start,) = writer.append([("turn/start", {})])
        writer.append([("assistant/message", {"text": "x" * store.log.CACHE_LAG_BYTES})])
        (end,) = writer.append([("turn/end", {"stop_reason": "completed"})], commit=True)
    record = decode_cache(read_file(st.path("s1", "identity")))
    assert record["timing"]["settled_ms"] == pytest.approx((end["ts"] - start["ts"]) * 1000.0)
    assert record["identity"] == CONTINUABLE and record["resume"] == CONTINUABLE
    assert (record["seq"], record["turns"], record["last_stop_reason"]) == (3, 1, "completed")
    identity = store.read_identity(st, "s1", 0)
    assert identity.verdict is None and identity.descriptor == store.parse_descriptor(CONTINUABLE)
    assert identity.projection.to_record() == record
