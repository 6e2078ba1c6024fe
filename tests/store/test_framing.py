"""Record framing: one test per damage reason (each damages a chosen byte), fuzzing, torn tails."""

from __future__ import annotations

import os
import re
import struct
import zlib
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from subagents import store
from subagents.store.framing import FRAME, MAX_RECORD_BYTES, scan
from subagents.store.records import event_problem

from ..session_bytes import log_bytes, log_data, write_log
from ._support import read_file, records_blob, refit_crc, write_file

# byte positions inside a record whose payload starts with {"seq": <fixint>, ...}
LEN_LSB, LEN_MSB, CRC_BYTE, MAP_BYTE, SEQ_VALUE = 0, 3, 4, 8, 8 + 1 + 4


def three() -> tuple[bytes, list[int], list[dict]]:
    payloads = [{"seq": i, "type": "assistant/message", "data": "x" * (10 * i)} for i in range(3)]
    blob, offsets = records_blob(payloads)
    return blob, offsets, payloads


def damaged(at: int, value: int, *, fix_crc_of: int | None = None) -> tuple[bytes, list[int], list[dict]]:
    blob, offsets, payloads = three()
    buf = bytearray(blob)
    buf[at] = value
    if fix_crc_of is not None:
        refit_crc(buf, fix_crc_of)
    return bytes(buf), offsets, payloads


def test_roundtrip_records_offsets_and_end():
    """Valid records come back in order with their start offsets and no damage."""
    blob, offsets, payloads = three()
    result = scan(blob)
    assert result.records == payloads
    assert result.offsets == offsets
    assert result.end == len(blob)
    assert result.damage is None


def test_empty_input_is_clean():
    """No bytes is an empty, undamaged file."""
    assert scan(b"") == store.ScanResult([], 0, [], None)


def test_start_seq_and_base_offset():
    """A suffix of a file scans with its first seq and its offsets shifted by the base."""
    blob, offsets = records_blob([{"seq": 5}, {"seq": 6}])
    result = scan(blob, start_seq=5, base_offset=100)
    assert [r["seq"] for r in result.records] == [5, 6]
    assert result.offsets == [100 + o for o in offsets]
    assert result.end == 100 + len(blob)
    wrong = scan(blob, start_seq=0, base_offset=100)
    assert wrong.damage == store.Damage(100, len(blob), "seq-gap", "expected 0, got 5")


def test_short_header():
    """A record cut inside its 8-byte frame header: short-header, the prefix before it survives."""
    blob, offsets, payloads = three()
    data = blob[: offsets[2] + 5]
    result = scan(data)
    assert result.damage == store.Damage(offsets[2], 5, "short-header", "5 bytes left")
    assert result.records == payloads[:2]
    assert result.end == offsets[2]


def test_short_payload_from_a_longer_length():
    """The last record's length byte raised by one: the payload runs past the end."""
    blob, offsets, payloads = three()
    at = offsets[2] + LEN_LSB
    data, _, _ = damaged(at, blob[at] + 1)
    result = scan(data)
    assert result.damage is not None
    assert result.damage.reason == "short-payload"
    assert result.damage.offset == offsets[2]
    assert result.damage.dropped == len(data) - offsets[2]
    assert result.records == payloads[:2]
    assert result.end == offsets[2]


def test_short_payload_from_truncation():
    """A file cut inside the last payload: short-payload with the exact missing count."""
    blob, offsets, payloads = three()
    data = blob[:-3]
    length = FRAME.unpack_from(blob, offsets[2])[0]
    result = scan(data)
    assert result.damage == store.Damage(offsets[2], len(data) - offsets[2], "short-payload", f"need {length}, have {length - 3}")
    assert result.records == payloads[:2]


def test_bad_length():
    """The high byte of a middle record's length set: a length no record can have."""
    offsets = three()[1]
    data, _, payloads = damaged(offsets[1] + LEN_MSB, 0xFF)
    result = scan(data)
    assert result.damage is not None
    assert (result.damage.offset, result.damage.dropped, result.damage.reason) == (offsets[1], len(data) - offsets[1], "bad-length")
    assert FRAME.unpack_from(data, offsets[1])[0] > MAX_RECORD_BYTES
    assert result.records == payloads[:1]
    assert result.end == offsets[1]


@pytest.mark.parametrize("where", ["payload", "crc"])
def test_crc_mismatch(where):
    """One flipped byte in a middle record's payload or CRC: crc-mismatch, the rest dropped."""
    blob, offsets, payloads = three()
    at = offsets[1] + (MAP_BYTE + 3 if where == "payload" else CRC_BYTE)
    data, _, _ = damaged(at, blob[at] ^ 0x01)
    result = scan(data)
    assert result.damage == store.Damage(offsets[1], len(data) - offsets[1], "crc-mismatch", "")
    assert result.records == payloads[:1]


def test_undecodable():
    """A payload byte replaced by msgpack's never-used 0xc1, CRC refitted: undecodable."""
    offsets = three()[1]
    data, _, payloads = damaged(offsets[1] + MAP_BYTE, 0xC1, fix_crc_of=offsets[1])
    result = scan(data)
    assert result.damage is not None
    assert (result.damage.offset, result.damage.dropped, result.damage.reason) == (offsets[1], len(data) - offsets[1], "undecodable")
    assert result.records == payloads[:1]


def test_not_a_record_nil_seq():
    """The seq value byte replaced by nil, CRC refitted: valid msgpack but not a record."""
    offsets = three()[1]
    data, _, payloads = damaged(offsets[1] + SEQ_VALUE, 0xC0, fix_crc_of=offsets[1])
    result = scan(data)
    assert result.damage == store.Damage(offsets[1], len(data) - offsets[1], "not-a-record", "")
    assert result.records == payloads[:1]


@pytest.mark.parametrize("payload", [[1, 2], "seq", 7, None, {"seq": True}, {"seq": 1.0}, {"seq": "1"}, {"type": "x"}])
def test_not_a_record_shapes(payload):
    """Anything but a map with an integer (non-bool) seq is not a record."""
    body = msgpack.packb(payload, use_bin_type=True)
    good, _ = records_blob([{"seq": 0}])
    data = good + FRAME.pack(len(body), zlib.crc32(body)) + body
    result = scan(data)
    assert result.damage == store.Damage(len(good), len(data) - len(good), "not-a-record", "")
    assert result.records == [{"seq": 0}]


def test_seq_gap():
    """The seq value byte changed to 7, CRC refitted: a valid record in the wrong place."""
    offsets = three()[1]
    data, _, payloads = damaged(offsets[1] + SEQ_VALUE, 0x07, fix_crc_of=offsets[1])
    result = scan(data)
    assert result.damage == store.Damage(offsets[1], len(data) - offsets[1], "seq-gap", "expected 1, got 7")
    assert result.records == payloads[:1]


def test_seq_gap_from_a_missing_record():
    """A whole record cut out of the middle reads as a gap at the next one."""
    blob, offsets, payloads = three()
    data = blob[: offsets[1]] + blob[offsets[2] :]
    result = scan(data)
    assert result.damage == store.Damage(offsets[1], len(data) - offsets[1], "seq-gap", "expected 1, got 2")


def test_valid_records_after_damage_are_not_in_the_prefix():
    """Nothing after the first damage is trusted, even records that would decode."""
    blob, offsets, payloads = three()
    buf = bytearray(blob)
    buf[offsets[0] + MAP_BYTE + 2] ^= 0xFF
    result = scan(bytes(buf))
    assert result.records == []
    assert result.damage is not None and result.damage.offset == 0 and result.damage.dropped == len(blob)


def test_format_md_worked_example_matches_encode_record():
    """The worked example in FORMAT.md is exactly what encode_record writes."""
    text = (Path(store.__file__).parent / "FORMAT.md").read_text()
    match = re.search(r"<!-- example-record: (\{.*?\}) -->\s*```\s*\n([0-9a-f ]+)\n```", text)
    assert match, "FORMAT.md lost its worked example"
    payload = {"seq": 0, "ts": 1700000000.5, "type": "turn/start", "data": {}, "epoch": 1}
    assert msgpack.unpackb(store.encode_record(payload)[8:]) == payload
    assert eval(match.group(1)) == payload  # noqa: S307 - a literal from our own doc
    assert bytes.fromhex(match.group(2)) == store.encode_record(payload)


# -- fuzzing --------------------------------------------------------------------

json_values = hs.recursive(
    hs.none() | hs.booleans() | hs.integers(-(2**63), 2**64 - 1) | hs.floats(allow_nan=False) | hs.text(max_size=20)
    | hs.binary(max_size=20),
    lambda inner: hs.lists(inner, max_size=4) | hs.dictionaries(hs.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)


def check_invariants(data: bytes, result: store.ScanResult, start_seq: int = 0) -> None:
    assert [r["seq"] for r in result.records] == list(range(start_seq, start_seq + len(result.records)))
    assert result.offsets == sorted(result.offsets)
    assert 0 <= result.end <= len(data)
    if result.damage is None:
        assert result.end == len(data)
    else:
        assert result.damage.offset == result.end
        assert result.damage.dropped == len(data) - result.end > 0
        assert result.damage.reason in {"short-header", "short-payload", "bad-length", "crc-mismatch", "undecodable", "not-a-record", "seq-gap"}


@settings(max_examples=300, deadline=None)
@given(hs.binary(max_size=300))
def test_random_bytes_never_raise(data):
    """Arbitrary bytes scan to a (usually empty) valid prefix and a damage value, never an exception."""
    check_invariants(data, scan(data))


@settings(max_examples=60, deadline=None)
@given(hs.lists(json_values, max_size=6), hs.integers(0, 3))
def test_random_payloads_never_raise(values, start):
    """Records carrying any msgpack value (map or not, seq or not) scan without raising."""
    chunks = []
    for i, value in enumerate(values):
        payload = {"seq": start + i, "v": value} if i % 2 == 0 else value
        body = msgpack.packb(payload, use_bin_type=True)
        chunks.append(FRAME.pack(len(body), zlib.crc32(body)) + body)
    data = b"".join(chunks)
    check_invariants(data, scan(data, start_seq=start), start)


@settings(max_examples=60, deadline=None)
@given(hs.lists(hs.dictionaries(hs.text(max_size=6), json_values, max_size=3), min_size=1, max_size=5))
def test_valid_records_roundtrip(bodies):
    """Any maps given contiguous seqs come back identical."""
    payloads = [{**b, "seq": i} for i, b in enumerate(bodies)]
    blob, offsets = records_blob(payloads)
    result = scan(blob)
    assert result.damage is None and result.offsets == offsets
    assert result.records == [msgpack.unpackb(msgpack.packb(p, use_bin_type=True), raw=False, strict_map_key=False) for p in payloads]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hs.data())
def test_damaged_byte_yields_a_prefix(data):
    """Any single damaged byte leaves a prefix of the original records, never more, never a raise."""
    blob, offsets, payloads = three()
    at = data.draw(hs.integers(0, len(blob) - 1))
    value = data.draw(hs.integers(0, 255).filter(lambda v: v != blob[at]))
    buf = bytearray(blob)
    buf[at] = value
    result = scan(bytes(buf))
    check_invariants(bytes(buf), result)
    assert result.records == payloads[: len(result.records)]
    assert result.damage is not None
    damaged_record = max(i for i, o in enumerate(offsets) if o <= at)
    assert len(result.records) == damaged_record


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hs.data())
def test_a_damaged_byte_in_a_padded_checked_log_yields_the_records_before_it(data):
    """A log as a reader scans it (padded, each event checked): a damaged byte anywhere in its records
    leaves exactly the records before the damaged one, with their offsets, and the damage at its start;
    the zero padding after undamaged records is their end. What a fast path through clean records must
    keep: the records it takes are the ones the record-by-record read takes, and it stops where that
    read names the damage."""
    count = data.draw(hs.integers(1, 6))
    payloads = [{"seq": i, "ts": 1.0 + i, "type": "assistant/message", "data": {"text": "x" * (7 * i)}, "epoch": 0}
                for i in range(count)]
    blob, offsets = records_blob(payloads)
    padded = blob + bytes(-len(blob) % 64 or 64)
    clean = scan(padded, check=event_problem, padded=True)
    assert (clean.records, clean.offsets, clean.end, clean.damage) == (payloads, offsets, len(blob), None)
    at = data.draw(hs.integers(0, len(blob) - 1))
    value = data.draw(hs.integers(0, 255).filter(lambda v: v != blob[at]))
    buf = bytearray(padded)
    buf[at] = value
    result = scan(bytes(buf), check=event_problem, padded=True)
    damaged_record = max(i for i, o in enumerate(offsets) if o <= at)
    assert result.records == payloads[:damaged_record]
    assert result.offsets == offsets[:damaged_record]
    assert result.damage is not None and result.damage.offset == result.end == offsets[damaged_record]


# -- a torn last record, at every byte ------------------------------------------


@pytest.mark.parametrize("cache", ["behind", "missing"])
def test_last_record_torn_at_every_offset(st, cache):
    """Cut the last record at every byte: exact prefix, 'torn', and open appends at the right seq."""
    store.create_session(st, "s1", events=[("subagent/descriptor", {"version": 1, "mode": "one-shot", "provider": "p"})])
    with store.LogWriter.open(st, "s1", epoch=0) as writer:
        # a log of CACHE_LAG_BYTES: its commit writes the identity cache (a shorter log has none)
        writer.append([("turn/start", {}), ("assistant/message", {"text": "x" * store.log.CACHE_LAG_BYTES}),
                       ("turn/end", {"stop_reason": "completed"})], commit=True)
        writer.append([("notice/received", {"text": "a notice that was never committed"})])
    full = log_data(st, "s1")  # without the padding: every cut below falls inside the last record
    identity = read_file(st.path("s1", "identity"))
    good = store.inspect(st, "s1")
    assert good.status == "clean" and good.next_seq == 5
    last_at, last_len = good.offsets[-1], len(full) - good.offsets[-1]
    for cut in range(1, last_len):
        write_log(st, "s1", full[: last_at + cut])
        if cache == "missing":
            os.unlink(st.path("s1", "identity"))
        else:
            write_file(st.path("s1", "identity"), identity)
        found = store.inspect(st, "s1")
        assert found.status == "torn", cut
        assert found.events == good.events[:-1]
        assert found.end == last_at and found.size == last_at + cut
        # dropped: the cut record's bytes up to the last non-zero one (zeros at a log's end read as its padding)
        assert found.damage == store.Damage(
            last_at, len(full[last_at : last_at + cut].rstrip(b"\0")), "short-header" if cut < FRAME.size else "short-payload",
            found.damage.detail,
        )
        with store.LogWriter.open(st, "s1", epoch=0) as writer:
            assert writer.repaired == []
            assert len(log_bytes(st, "s1")) == last_at
            assert writer.next_seq == 4
            (record,) = writer.append([("notice/received", {"cut": cut})])
            assert record["seq"] == 4
        after = store.inspect(st, "s1")
        assert after.status == "clean" and [e["seq"] for e in after.events] == [0, 1, 2, 3, 4]
        assert after.events[4]["data"] == {"cut": cut}


def test_frame_constant_is_two_le_u32():
    """The frame header is two little-endian u32: length then CRC32 of the payload."""
    assert FRAME.format in ("<II", b"<II") and FRAME.size == 8
    record = store.encode_record({"seq": 0})
    length, crc = struct.unpack("<II", record[:8])
    assert length == len(record) - 8 and crc == zlib.crc32(record[8:])


# -- the torn-tail rule shared by the log and the mailbox (framing.torn_tail, FORMAT.md §3.3) ------------


def _three_records() -> tuple[bytes, list[int]]:
    return records_blob([{"seq": i, "type": "turn/end" if i == 1 else "note", "pad": "x" * 40} for i in range(3)])


@pytest.mark.parametrize(
    ("edit", "every_record", "torn"),
    [
        ("cut-last", True, True),  # a partial final frame, then the file's end
        ("cut-last-into-padding", True, True),  # a partial final frame, then zeros
        ("flip-last", True, False),  # a whole frame that fails: a committed record changed
        ("flip-last", False, True),  # in a log, an event of a turn that never ended: promised to nobody
        ("flip-first", True, False),  # records chain after it
        ("flip-first", False, False),  # a turn/end chains after it
        ("cut-last-before-checkpoint", True, False),  # the writer saw that record whole
    ],
)
def test_torn_tail_is_one_rule_for_the_log_and_the_mailbox(edit, every_record, torn):
    from subagents.store.framing import data_end, torn_tail

    data, offsets = _three_records()
    buf = bytearray(data)
    committed_end = 0
    if edit.startswith("cut-last"):
        buf = buf[: len(buf) - 5]
        if edit == "cut-last-into-padding":
            buf += bytes(4096 - len(buf) % 4096)
        if edit == "cut-last-before-checkpoint":
            committed_end = len(data)
    else:
        buf[(offsets[2] if edit == "flip-last" else offsets[0]) + FRAME.size + 3] ^= 0x5A
    result = scan(bytes(buf), padded=True)
    assert result.damage is not None and data_end(bytes(buf)) > 0
    commits = None if every_record else (lambda payload: payload.get("type") == "turn/end")
    assert torn_tail(bytes(buf), result.damage, len(result.records), commits=commits, padded=True,
                     committed_end=committed_end) is torn
