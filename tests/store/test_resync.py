"""Finding the records after a damaged region costs about one pass over it, whatever the region holds.

After damage, readers look for the next frame that proves committed records
follow (``find_committed``: a torn tail or corruption; the next record of an
index or a control file). They tried every byte offset in Python, and a CRC
of every length field that fitted in the file: a region of zeros (a file
extended behind the store's back) decoded an empty frame at every byte, and
random bytes (a garbled block) made the work grow with the square of the
region, so one damaged file held a listing for minutes. Now an offset is a
candidate only where a payload could start with a non-empty msgpack map
(found by a C-speed search), and its CRC is computed only when the frame
after it could be its successor, or it ends the data. The same offsets are
found: a property test compares it with the byte-by-byte search.
"""

from __future__ import annotations

import random
import zlib
from typing import Any, Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from subagents.store import framing
from subagents.store.framing import FRAME, MAX_RECORD_BYTES, data_end, find_committed, scan_all

from ._support import event, records_blob


class CrcCounter:
    """``zlib`` for the framing module, counting the bytes its ``crc32`` reads."""

    def __init__(self) -> None:
        self.calls = 0
        self.bytes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(zlib, name)

    def crc32(self, data: Any, value: int = 0) -> int:
        self.calls += 1
        self.bytes += len(data)
        return zlib.crc32(data, value)


def counted(monkeypatch) -> CrcCounter:
    counter = CrcCounter()
    monkeypatch.setattr(framing, "zlib", counter)
    return counter


def rows(first: int, count: int) -> bytes:
    return records_blob([{"seq": seq, "row": "r" * 40} for seq in range(first, first + count)])[0]


def test_zeros_after_an_index_are_its_tail_at_the_cost_of_a_search(monkeypatch):
    blob = rows(0, 3) + bytes(1 << 20)
    crc = counted(monkeypatch)
    found = scan_all(blob)
    assert [r["seq"] for r in found.records] == [0, 1, 2] and found.tail is not None
    assert crc.calls <= 10, f"{crc.calls} CRCs over a MiB of zeros"


def test_records_after_a_long_run_of_zeros_or_garbage_are_found(monkeypatch):
    noise = random.Random(7).randbytes(1 << 20)
    for gap in (bytes(1 << 20), noise):
        blob = rows(0, 3) + gap + rows(3, 3)
        crc = counted(monkeypatch)
        found = scan_all(blob)
        assert [r["seq"] for r in found.records] == [0, 1, 2, 3, 4, 5] and found.tail is None
        assert [s.seqs for s in found.skipped] == [range(3, 3)]
        assert crc.bytes <= 4 * len(blob), f"CRCs read {crc.bytes} bytes of a {len(blob)}-byte file"


def test_random_bytes_cost_about_one_pass(monkeypatch):
    noise = random.Random(11).randbytes(2 << 20)
    crc = counted(monkeypatch)
    assert find_committed(noise, 0, 0, lambda _p: True, torn_reason="crc-mismatch") is None
    assert crc.bytes <= len(noise), f"CRCs read {crc.bytes} bytes of {len(noise)} random bytes"


def byte_by_byte(data: bytes, start: int, expected_seq: int, predicate: Callable[[dict[str, Any]], bool], *,
                 torn_reason: str, padded: bool = False) -> int | None:
    """The search as it was: every offset, every frame whose CRC matches (the specification)."""
    total, pos = len(data), start
    inside_cut = torn_reason in ("short-payload", "short-header")
    last = data_end(data) if padded else total
    while pos + FRAME.size <= total:
        length, crc = FRAME.unpack_from(data, pos)
        end = pos + FRAME.size + length
        if length <= MAX_RECORD_BYTES and end <= total and zlib.crc32(data[pos + FRAME.size : end]) == crc:
            status, payload, _ = framing._frame_at(data, pos)
            if status == "ok" and payload["seq"] >= expected_seq and predicate(payload):
                count, _ = framing._chain(data, pos, payload["seq"])
                if count >= 2 or (count == 1 and end >= last and not inside_cut):
                    return pos
        pos += 1
    return None


# records of every map size a payload starts with but map 32 (65,536 keys): 5 keys, 1 key, 16 keys (map 16)
LOG = [event(0, "turn/start"), event(1, "assistant/message", {"text": "hi"}), event(2, "turn/end", {"stop_reason": "completed"}),
       event(3, "turn/start"), {"seq": 4}, {"seq": 5, **{f"k{i}": i for i in range(15)}}, {"seq": 6, "type": "turn/end"}]
PIECES = hs.one_of(
    hs.sampled_from([bytes(n) for n in (1, 7, 8, 9, 300)]),
    hs.binary(min_size=1, max_size=40),
    hs.lists(hs.sampled_from(LOG), min_size=1, max_size=3).map(lambda evs: records_blob(evs)[0]),
    hs.sampled_from(LOG).map(lambda ev: records_blob([ev])[0]).flatmap(lambda b: hs.integers(1, len(b) - 1).map(lambda n: b[:n])),
    hs.sampled_from([b"\x81", b"\xde\x00\x01", b"\xdf", b"\x85\xa3seq"]),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hs.lists(PIECES, min_size=1, max_size=8), hs.data())
def test_the_search_finds_what_the_byte_by_byte_search_finds(pieces, draw):
    data = b"".join(pieces)
    start = draw.draw(hs.integers(0, len(data)))
    expected = draw.draw(hs.integers(0, 6))
    reason = draw.draw(hs.sampled_from(["crc-mismatch", "short-payload", "short-header", "undecodable"]))
    padded = draw.draw(hs.booleans())
    commits = draw.draw(hs.sampled_from([lambda _p: True, lambda p: p.get("type") == "turn/end"]))
    assert find_committed(data, start, expected, commits, torn_reason=reason, padded=padded) == byte_by_byte(
        data, start, expected, commits, torn_reason=reason, padded=padded)
