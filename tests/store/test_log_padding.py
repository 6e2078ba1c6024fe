"""A session log may end in zero padding (FORMAT.md §3.4): how it reads, torn writes into it, damage after it.

The writer pads the file to the next 4 KiB boundary so that later appends
overwrite bytes in place; these tests pin the reading side on bytes made
here (``framing.scan(padded=True)``, ``reader.classify``) and the writers'
side on real session files.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from subagents import store
from subagents.store.framing import FRAME, find_committed, scan
from subagents.store.lease import write_released
from subagents.store.reader import classify, scan_events
from subagents.store.session_file import BLOCK

from .. import session_bytes as raw
from ..session_bytes import patch
from ._support import event, records_blob

# a log as a writer leaves it: a turn that committed, a second one still open
LOG = [event(0, "turn/start"), event(1, "assistant/message", {"text": "hi"}), event(2, "turn/end", {"stop_reason": "completed"}),
       event(3, "turn/start", epoch=2), event(4, "assistant/message", {"text": "x" * 40}, epoch=2)]


def padded(blob: bytes, zeros: int) -> bytes:
    return blob + bytes(zeros)


@settings(max_examples=200, deadline=None)
@given(hs.integers(0, len(LOG)), hs.integers(0, 9000))
def test_an_all_zero_remainder_is_the_end_not_damage(count, zeros):
    """Records followed by any number of zeros read as those records, clean, ending where the zeros start."""
    blob, offsets = records_blob(LOG[:count])
    data = padded(blob, zeros)
    result = scan_events(data)
    assert (result.records, result.offsets, result.end, result.damage) == (LOG[:count], offsets, len(blob), None)
    assert classify(data, result.damage) == "clean"
    unpadded = scan(data)  # every other file (mailbox, control, index) keeps the old rule: zeros are damage
    assert unpadded.records == LOG[:count] and (unpadded.damage is None) == (zeros == 0)


def test_a_suffix_with_padding_keeps_its_base_offset():
    """A writer folding what another appended reads a suffix: the end is reported in log offsets."""
    blob, offsets = records_blob(LOG)
    result = scan_events(padded(blob[offsets[3]:], 100), start_seq=3, base_offset=offsets[3])
    assert [r["seq"] for r in result.records] == [3, 4] and result.end == len(blob) and result.damage is None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hs.data())
def test_a_non_zero_byte_after_the_padding_is_damage(data):
    """Zeros, then anything that is not zero, is damage at the start of the zeros (a zero frame is never a record)."""
    blob, _ = records_blob(LOG)
    zeros = data.draw(hs.integers(1, 5000))
    tail = data.draw(hs.binary(min_size=1, max_size=40).filter(lambda b: any(b)))
    raw = blob + bytes(zeros) + tail
    result = scan_events(raw)
    assert result.records == LOG and result.end == len(blob)
    # dropped ends at the last non-zero byte: zeros after it are padding, not data the damage hides
    assert result.damage is not None and result.damage.offset == len(blob) and result.damage.dropped == zeros + len(tail.rstrip(b"\0"))
    assert classify(raw, result.damage, len(LOG)) == "torn"  # no committed turn/end after it


def test_committed_records_after_a_zeroed_record_are_corruption():
    """A record zeroed in the committed region, with a chained turn/end after it, is corrupt (padding or not)."""
    committed = [*LOG[:3], event(3, "turn/start", epoch=2), event(4, "turn/end", {"stop_reason": "completed"}, epoch=2)]
    blob, offsets = records_blob(committed)
    for tail in (0, 700):  # without padding, and with the writer's padding after the last turn/end
        raw = blob[: offsets[3]] + bytes(offsets[4] - offsets[3]) + blob[offsets[4]:] + bytes(tail)
        result = scan_events(raw)
        assert result.end == offsets[3] and result.damage is not None
        assert classify(raw, result.damage, 3) == "corrupt", tail


def test_a_lone_turn_end_before_the_padding_chains():
    """Damage then a lone committed turn/end that ends where the padding starts: corrupt, as at the file's end."""
    committed = [*LOG[:3], event(3, "turn/start", epoch=2), event(4, "turn/end", {"stop_reason": "completed"}, epoch=2)]
    blob, offsets = records_blob(committed)
    buf = bytearray(blob)
    buf[offsets[3] + FRAME.size + 3] ^= 0xFF  # a bit flip inside turn/start: crc-mismatch, its length intact
    for tail in (0, 1, 7, 8, 3000):
        raw = bytes(buf) + bytes(tail)
        result = scan_events(raw)
        assert (result.end, result.damage.reason) == (offsets[3], "crc-mismatch"), tail
        assert classify(raw, result.damage, 3) == "corrupt", tail
        assert find_committed(raw, offsets[3] + 1, 3, lambda p: True, torn_reason="crc-mismatch", padded=False) == (
            offsets[4] if tail == 0 else None)  # an unpadded file's rule: only the very end counts


@pytest.mark.parametrize("which", [3, 4])
def test_a_write_torn_inside_the_padding_is_a_torn_tail(which):
    """Every prefix of the last batch, then zeros to the block's end (a write torn in place): the records before it, torn."""
    blob, offsets = records_blob(LOG)
    start = offsets[which]
    for cut in range(1, len(blob) - start):
        raw = blob[:start + cut] + bytes(4096)
        result = scan_events(raw)
        assert result.records == LOG[: len(result.records)]
        if not any(blob[start:start + cut]):
            assert result.damage is None and result.end == start  # only zeros landed: no write at all
            continue
        if result.damage is None:  # the cut fell after a whole record of the batch
            assert result.end in offsets[which + 1:]
            continue
        assert result.damage.offset in offsets[which:] and result.damage.reason == "short-payload", cut
        assert classify(raw, result.damage, len(result.records)) == "torn", cut


def test_a_turn_end_inside_a_record_torn_in_the_padding_does_not_count():
    """A lone frame-shaped turn/end inside the payload of a record torn in the padding is that record's data, not a
    commit (as inside a record cut at the end of an unpadded file, FORMAT.md §3.3)."""
    blob, offsets = records_blob(LOG[:3])
    inner = records_blob([event(3, "turn/end", {"stop_reason": "completed"}, epoch=2)])[0]
    carrier = records_blob([event(3, "tool/result", {"call_id": "c", "is_error": False, "output": inner})])[0]
    # the carrier record torn right after the embedded frames, zeros after it
    cut = carrier.index(inner) + len(inner)
    raw = blob + carrier[:cut] + bytes(2000)
    result = scan_events(raw)
    assert result.end == len(blob) and result.damage.reason == "short-payload"
    assert classify(raw, result.damage, 3) == "torn"
    unpadded = blob + carrier[:cut]  # the same write torn at the end of the file: the rule this one follows
    assert classify(unpadded, scan_events(unpadded).damage, 3) == "torn"


# -- the writers -------------------------------------------------------------------------------

ONE_SHOT = {"version": 1, "mode": "one-shot", "provider": "spawn", "label": "worker"}


def file_size(st: store.Store, sid: str = "s1") -> int:
    return os.path.getsize(st.session_path(sid))


def test_a_new_session_and_every_append_leave_the_file_padded_to_a_block(any_st):
    """Creation pads the file to 4 KiB; appends overwrite the padding in place (the size does not
    change) until one crosses the block, which pads to the next; readers see exactly the records."""
    store.create_session(any_st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    assert file_size(any_st) == BLOCK
    sizes = set()
    with store.LogWriter.open(any_st, "s1", epoch=0) as writer:
        for i in range(60):
            writer.append([("assistant/message", {"text": "x" * 100, "i": i})])
            sizes.add(file_size(any_st))
            assert file_size(any_st) % BLOCK == 0 and file_size(any_st) >= raw.log_start(any_st, "s1") + writer.projection.end_offset
        end = writer.projection.end_offset
    assert len(sizes) < 6  # ~24 appends of 171 bytes per block: the size changed once per block, not per append
    found = store.inspect(any_st, "s1")
    assert (found.status, found.end, found.next_seq, found.damage) == ("clean", end, 61, None)
    assert raw.log_bytes(any_st, "s1")[end:] == bytes(file_size(any_st) - raw.log_start(any_st, "s1") - end)


def test_a_second_writer_appending_inside_the_padding_is_seen(st):
    """Same-epoch writers: appends that do not change the file's size are still picked up (one pread at the end)."""
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    a = store.LogWriter.open(st, "s1", epoch=0)
    b = store.LogWriter.open(st, "s1", epoch=0)
    try:
        size = file_size(st)
        assert a.append([("assistant/message", {"w": "a"})])[0]["seq"] == 1
        assert b.append([("assistant/message", {"w": "b"})])[0]["seq"] == 2
        assert file_size(st) == size  # both in place
        assert a.append([("assistant/message", {"w": "a"})])[0]["seq"] == 3
        assert b.append([("assistant/message", {"w": "b"})])[0]["seq"] == 4
    finally:
        a.close()
        b.close()
    found = store.inspect(st, "s1")
    assert found.status == "clean" and [e["data"]["w"] for e in found.events[1:]] == ["a", "b", "a", "b"]


def test_a_write_torn_inside_the_padding_is_cut_by_the_next_open(st):
    """Half a batch written over the padding (a crash before the fsync): torn; ``LogWriter.open``
    truncates it to the valid prefix (no padding left: valid too) and closes the open turn; appends go on."""
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        writer.append([("turn/start", {}), ("assistant/message", {"text": "kept"})])
        end = writer.projection.end_offset
    lost, _ = records_blob([event(3, "assistant/message", {"text": "y" * 300}), event(4, "tool/call", {"call_id": "lost"})])
    size = file_size(st)
    patch(st, "s1", raw.log_start(st, "s1") + end, lost[: len(lost) // 2])  # in place: the size stays
    assert file_size(st) == size
    found = store.inspect(st, "s1")
    assert (found.status, found.end, found.next_seq) == ("torn", end, 3)
    assert found.damage is not None and found.damage.offset == end
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        assert [r["type"] for r in writer.repaired] == ["turn/end"] and writer.repaired[0]["seq"] == 3
        writer.append([("turn/start", {})], commit=True)
    found = store.inspect(st, "s1")
    assert found.status == "clean" and [e["type"] for e in found.events[3:]] == ["turn/end", "turn/start"]
    assert found.offsets[3] == end


def test_a_non_zero_byte_after_the_padding_is_a_torn_tail_to_the_writer(st):
    """A byte flipped at the end of the padding: the zeros before it are not the end; the tail is
    torn (no committed turn/end after it) and the resume path cuts it."""
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        writer.append([("turn/start", {}), ("turn/end", {"stop_reason": "completed"})], commit=True)
        end = writer.projection.end_offset
    patch(st, "s1", file_size(st) - 1, b"\x01")
    found = store.inspect(st, "s1")
    assert (found.status, found.end, found.damage.offset) == ("torn", end, end)
    assert found.damage.dropped == file_size(st) - raw.log_start(st, "s1") - end
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        assert writer.repaired == []
    assert store.inspect(st, "s1").status == "clean" and file_size(st) == raw.log_start(st, "s1") + end


def test_a_writer_sees_another_writers_bytes_in_its_padding_as_damage(st):
    """Bytes that are not a record where the padding was: the writer refuses to append after them."""
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        writer.append([("turn/start", {})])
        before = raw.file_bytes(st, "s1")
        patch(st, "s1", raw.log_start(st, "s1") + writer.projection.end_offset, b"\x05\x00\x00\x00garbage")
        with pytest.raises(store.CorruptSessionError):
            writer.append([("assistant/message", {})])
    assert len(raw.file_bytes(st, "s1")) == len(before)


def test_a_tail_sees_appends_that_do_not_change_the_file_size(st):
    """``LogTail`` reads from its offset, not from the size: in-place appends are followed, one by one."""
    store.create_session(st, "s1", events=[("subagent/descriptor", ONE_SHOT)])
    tail = store.LogTail(st, "s1", store.inspect(st, "s1"))
    size = file_size(st)
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        for i in range(1, 6):
            writer.append([("assistant/message", {"i": i})])
            assert file_size(st) == size
            assert [(e["seq"], e["data"]["i"]) for e in tail.poll()] == [(i, i)]
            assert tail.poll() == []


def test_a_released_lease_row_comes_from_the_writer_when_the_padding_follows_its_log(st):
    """The release's catalog row uses the writer's projection when only padding follows it (not when
    another writer appended in place): the row's last activity is the log's last record either way."""
    request = store.session.NewSession("s1", events=[("subagent/descriptor", ONE_SHOT)], lease_owner="o1", parent_session=None)
    [created] = store.session.commit_sessions(st, [request], store.session.publish_sessions(st, [request]))
    writer = store.LogWriter.attach(st, "s1", epoch=1, projection=created.projection)
    seen = []

    def spy_release(store_, file, slots, *, header, projection):
        seen.append(projection)
        write_released(store_, file, slots, header=header, projection=projection)

    try:
        writer.append([("turn/start", {}), ("turn/end", {"stop_reason": "completed"})], commit=True)
        writer.release_lease("o1", spy_release)
    finally:
        writer.close()
    assert seen == [writer.projection]
    assert store.read_lease(st, "s1").state == "released"
