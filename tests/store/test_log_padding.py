"""A session log may end in zero padding (FORMAT.md §3.4): how it reads, torn writes into it, damage after it.

The writer pads the file to the next 4 KiB boundary so that later appends
overwrite bytes in place; these tests pin the reading side on bytes made
here (``framing.scan(padded=True)``, ``reader.classify``) and the writers'
side on real session files.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from subagents import store
from subagents.store.framing import FRAME, find_committed, scan
from subagents.store.reader import classify, scan_events

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
    assert result.damage is not None and result.damage.offset == len(blob) and result.damage.dropped == zeros + len(tail)
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
