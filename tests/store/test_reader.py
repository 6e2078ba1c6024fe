"""Inspection: read-only, and the torn-tail / corrupt classification of damage."""

from __future__ import annotations

import os

import pytest

from subagents import store
from subagents.store.reader import classify

from .. import session_bytes as raw
from ._support import ONE_SHOT, event, records_blob, refit_crc, tree_state


def write_log(st, payloads, sid="s1"):
    store.create_session(st, sid)
    blob, offsets = records_blob(payloads)
    raw.write_log(st, sid, blob)
    assert not os.path.exists(st.path(sid, "identity"))  # short logs have no identity cache
    return blob, offsets


COMMITTED = [event(0, "subagent/descriptor", ONE_SHOT), event(1, "turn/start"), event(2, "assistant/message", {"t": "abc"}),
             event(3, "turn/end", {"stop_reason": "completed"}), event(4, "turn/start"), event(5, "assistant/message", {"t": "d"})]


def damage_at(blob, offsets, record, how):
    buf = bytearray(blob)
    at = offsets[record]
    if how == "crc-mismatch":
        buf[at + 10] ^= 0x40
    elif how == "bad-length":
        buf[at + 3] = 0xFF
    elif how == "undecodable":
        buf[at + 8] = 0xC1
        refit_crc(buf, at)
    elif how == "not-a-record":
        buf[at + 13] = 0xC0
        refit_crc(buf, at)
    elif how == "seq-gap":
        buf[at + 13] = 0x30
        refit_crc(buf, at)
    elif how == "short-payload":
        buf[at] += 1  # only at the last record: the payload runs past the end
    return bytes(buf)


def assert_read_only(st, sid, action):
    before = tree_state(st.root)
    result = action()
    assert tree_state(st.root) == before
    return result


@pytest.mark.parametrize("how", ["crc-mismatch", "bad-length", "undecodable", "not-a-record", "seq-gap"])
def test_damage_before_a_committed_turn_end_is_corrupt(st, how):
    """A bad record followed by a valid turn/end: inspect says corrupt, open refuses, nothing changes."""
    blob, offsets = write_log(st, COMMITTED)
    raw.write_log(st, "s1", damage_at(blob, offsets, 2, how))
    found = assert_read_only(st, "s1", lambda: store.inspect(st, "s1"))
    assert found.status == "corrupt"
    assert found.damage is not None and (found.damage.offset, found.damage.reason) == (offsets[2], how)
    assert found.events == COMMITTED[:2] and found.end == offsets[2]
    with pytest.raises(store.CorruptSessionError) as info:
        assert_read_only(st, "s1", lambda: store.LogWriter.open(st, "s1", epoch=0))
    assert info.value.offset == offsets[2] and how in info.value.reason
    assert raw.log_bytes(st, "s1") == damage_at(blob, offsets, 2, how)


@pytest.mark.parametrize("how", ["crc-mismatch", "bad-length", "undecodable", "not-a-record", "seq-gap"])
def test_damage_after_the_last_turn_end_is_torn(st, how):
    """Damage after the last committed turn/end (even with valid records behind it) is a torn tail."""
    blob, offsets = write_log(st, COMMITTED)
    data = damage_at(blob, offsets, 4, how)
    raw.write_log(st, "s1", data)
    found = assert_read_only(st, "s1", lambda: store.inspect(st, "s1"))
    assert found.status == "torn" and found.damage.reason == how
    assert found.events == COMMITTED[:4] and found.size == len(data)
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        assert writer.repaired == [] and writer.next_seq == 4
    assert raw.log_bytes(st, "s1") == blob[: offsets[4]]


def test_torn_last_record_and_clean_log(st):
    """A truncated last record is torn; an undamaged log is clean; inspect changes no byte or mtime."""
    blob, offsets = write_log(st, COMMITTED)
    found = assert_read_only(st, "s1", lambda: store.inspect(st, "s1"))
    assert (found.status, found.damage, found.end, found.size, found.next_seq) == ("clean", None, len(blob), len(blob), 6)
    assert found.offsets == offsets
    raw.write_log(st, "s1", damage_at(blob, offsets, 5, "short-payload"))
    found = assert_read_only(st, "s1", lambda: store.inspect(st, "s1"))
    assert found.status == "torn" and found.damage.reason == "short-payload"


def test_a_turn_end_inside_the_torn_record_does_not_count(st):
    """Only a turn/end *after* the damage offset makes corruption; the damaged record itself does not."""
    blob, offsets = write_log(st, COMMITTED[:4])
    data = damage_at(blob, offsets, 3, "crc-mismatch")
    assert classify(data, store.scan(data).damage) == "torn"


def test_missing_log_is_empty_and_clean(st):
    """A session whose file ends where its log begins reads as no events."""
    store.create_session(st, "s1")
    raw.write_log(st, "s1", b"")
    found = store.inspect(st, "s1")
    assert (found.events, found.status, found.size) == ([], "clean", 0)


def test_unknown_event_type_is_unsupported_unless_ignorable(st):
    """A type this build does not know is refused, unless the record says it is ignorable."""
    write_log(st, [event(0, "turn/start"), {**event(1, "future/thing"), "ignorable": True}, event(2, "turn/end")])
    assert store.inspect(st, "s1").status == "clean"
    write_log(st, [event(0, "turn/start"), event(1, "future/thing")], sid="s2")
    with pytest.raises(store.UnsupportedFormatError) as info:
        store.inspect(st, "s2")
    assert info.value.event_type == "future/thing"
    with pytest.raises(store.UnsupportedFormatError):
        store.LogWriter.open(st, "s2", epoch=0)


def test_inspect_of_unknown_session(st):
    """inspect of an id with no header is SessionNotFoundError; a bad id never becomes a path."""
    with pytest.raises(store.SessionNotFoundError):
        store.inspect(st, "nobody")
    with pytest.raises(store.InvalidSessionIdError):
        store.inspect(st, "../etc")


def test_read_from_returns_the_stored_suffix_and_changes_nothing(tmp_path) -> None:
    """read_from(seq) is the valid prefix from seq on; an open turn stays open; no byte changes."""
    from subagents import store as _store

    st = _store.Store(tmp_path / "s", durability="none")
    _store.create_session(st, "s1")
    with _store.LogWriter.open(st, "s1", epoch=0) as writer:
        writer.append([("turn/start", {}), ("step/start", {}), ("assistant/message", {"text": "x"})])
    before = raw.file_bytes(st, "s1")
    assert [e["type"] for e in _store.read_from(st, "s1", 1)] == ["step/start", "assistant/message"]
    assert _store.read_from(st, "s1", 3) == []
    assert raw.file_bytes(st, "s1") == before


@pytest.mark.parametrize("cwd", [None, "/" + "d" * 6000])
def test_a_tail_follows_the_log_region_of_the_session_file(st, cwd):
    """``LogTail`` measures the log from where it starts in the file (after a header of any length):
    it returns what was appended, waits out half a record, and after a repair cut it back gives
    only the events past the ones it returned."""
    store.create_session(st, "s1", cwd=cwd, events=[("subagent/descriptor", ONE_SHOT)])
    tail = store.LogTail(st, "s1", store.inspect(st, "s1"))
    assert tail.poll() == []
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        writer.append([("turn/start", {}), ("assistant/message", {"text": "a"})])
    assert [e["seq"] for e in tail.poll()] == [1, 2] and tail.poll() == []
    record, _ = records_blob([event(3, "assistant/message", {"text": "b"})])
    raw.append_log(st, "s1", record[:5])  # a write in flight: nothing yet
    assert tail.poll() == []
    raw.append_log(st, "s1", record[5:])
    assert [e["seq"] for e in tail.poll()] == [3]
    raw.append_log(st, "s1", record[:5])  # torn for good, then cut by the repair that closes the turn
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        assert [r["type"] for r in writer.repaired] == ["turn/end"]
    assert [e["type"] for e in tail.poll()] == ["turn/end"] and tail.poll() == []


def test_discards_and_a_roots_takes_are_commit_points_too(st):
    """A drain's ``message/discarded`` records, and a root's takes (``message/accepted``: a root runs
    no turn), are committed writes: damage they chain after is corruption, never cut as a torn tail
    (which would run the dropped messages again, or deliver the taken ones again). A child's
    ``message/accepted`` opens a turn, and commits nothing until its ``turn/end``."""
    store.create_session(st, "p")
    took = [event(0, "message/accepted", {"message_id": "m1"}), event(1, "message/accepted", {"message_id": "m2"}),
            event(2, "message/accepted", {"message_id": "m3"})]
    blob, offsets = write_log(st, took, sid="root")
    raw.write_log(st, "root", damage_at(blob, offsets, 0, "crc-mismatch"))
    assert store.inspect(st, "root").status == "corrupt"

    dropped = [*COMMITTED[:4], event(4, "message/discarded", {"message_id": "m1", "cause": "drain"}),
               event(5, "message/discarded", {"message_id": "m2", "cause": "drain"})]
    for sid, damaged, status in [("drained", 2, "corrupt"), ("opened", 4, "torn")]:
        store.create_session(st, sid, parent_session="p", origin="subagent")
        payloads = dropped if sid == "drained" else [*COMMITTED[:4], event(4, "message/accepted", {"message_id": "m1"}),
                                                      event(5, "message/accepted", {"message_id": "m2"}), event(6, "turn/start")]
        blob, offsets = records_blob(payloads)
        raw.write_log(st, sid, damage_at(blob, offsets, damaged, "crc-mismatch"))
        assert store.inspect(st, sid).status == status, sid
