"""Framed msgpack records: the one record format of every append-only store file.

A record is ``u32 LE length`` + ``u32 LE CRC32(payload)`` + ``payload``, the
payload a msgpack map holding a contiguous integer ``seq`` (FORMAT.md). The
writer side is ``encode_record``; the reader side is ``scan``, which never
raises: it returns the valid prefix and, when the bytes stop being valid,
a ``Damage`` value saying where, how many bytes were dropped and why — the
caller decides whether that is a torn tail or corruption (LevelDB's Reporter).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import msgpack

__all__ = [
    "FRAME",
    "MAX_RECORD_BYTES",
    "encode_record",
    "RecordEncoder",
    "decode_payload",
    "Damage",
    "ScanResult",
    "scan",
    "find_later_record",
]

FRAME = struct.Struct("<II")
# A length above this is treated as damage, not as a real record: it bounds the
# memory a corrupt length field can make a reader allocate.
MAX_RECORD_BYTES = 64 * 1024 * 1024


def encode_record(payload: dict[str, Any]) -> bytes:
    body = msgpack.packb(payload, use_bin_type=True)
    return FRAME.pack(len(body), zlib.crc32(body)) + body


class RecordEncoder:
    """``encode_record`` with one reusable msgpack ``Packer``.

    ``msgpack.packb`` builds a new ``Packer`` on every call; a log writer frames
    every event it appends, so it keeps one. Not thread-safe (neither is a writer).
    """

    __slots__ = ("_pack",)

    def __init__(self) -> None:
        self._pack = msgpack.Packer(use_bin_type=True).pack

    def __call__(self, payload: dict[str, Any]) -> bytes:
        body = self._pack(payload)
        return FRAME.pack(len(body), zlib.crc32(body)) + body


def decode_payload(body: bytes | memoryview) -> Any:
    return msgpack.unpackb(body, raw=False, strict_map_key=False)


@dataclass(frozen=True)
class Damage:
    """Where the valid prefix ends and why.

    ``reason`` is one of ``short-header``, ``short-payload``, ``bad-length``,
    ``crc-mismatch``, ``undecodable``, ``not-a-record``, ``seq-gap``.
    """

    offset: int
    dropped: int
    reason: str
    detail: str = ""


@dataclass(frozen=True)
class ScanResult:
    records: list[dict[str, Any]]
    end: int  # byte length of the valid prefix
    offsets: list[int] = field(default_factory=list)  # start offset of each record
    damage: Damage | None = None


def _frame_at(data: bytes | memoryview, pos: int) -> tuple[str, Any, int]:
    """Decode one frame at ``pos``: (status, payload-or-detail, next position)."""
    total = len(data)
    if total - pos < FRAME.size:
        return "short-header", f"{total - pos} bytes left", total
    length, crc = FRAME.unpack_from(data, pos)
    if length > MAX_RECORD_BYTES:
        return "bad-length", f"length {length}", total
    start = pos + FRAME.size
    if start + length > total:
        return "short-payload", f"need {length}, have {total - start}", total
    body = data[start : start + length]
    if zlib.crc32(body) != crc:
        return "crc-mismatch", "", total
    try:
        payload = decode_payload(body)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        return "undecodable", type(exc).__name__, total
    if not isinstance(payload, dict) or not isinstance(payload.get("seq"), int) or isinstance(payload.get("seq"), bool):
        return "not-a-record", "", total
    return "ok", payload, start + length


def scan(data: bytes | memoryview, *, start_seq: int = 0, base_offset: int = 0) -> ScanResult:
    """Read records from ``data`` until the first invalid one.

    ``start_seq`` is the seq the first record must carry (records are
    contiguous); ``base_offset`` is added to reported offsets when ``data``
    is a suffix of a file.
    """
    records: list[dict[str, Any]] = []
    offsets: list[int] = []
    pos = 0
    expected = start_seq
    total = len(data)
    while pos < total:
        status, value, nxt = _frame_at(data, pos)
        if status != "ok":
            return ScanResult(records, base_offset + pos, offsets, Damage(base_offset + pos, total - pos, status, value))
        if value["seq"] != expected:
            return ScanResult(
                records,
                base_offset + pos,
                offsets,
                Damage(base_offset + pos, total - pos, "seq-gap", f"expected {expected}, got {value['seq']}"),
            )
        records.append(value)
        offsets.append(base_offset + pos)
        expected += 1
        pos = nxt
    return ScanResult(records, base_offset + pos, offsets, None)


def find_later_record(
    data: bytes | memoryview, start: int, predicate: Callable[[dict[str, Any]], bool]
) -> int | None:
    """The offset of the first valid frame at or after ``start`` whose payload matches.

    Used after damage to tell a torn tail from corruption: if a committed
    record (``turn/end``) can still be found beyond the damage, the damage is
    not a write that never finished. Scans byte by byte; frames whose CRC
    does not match are skipped cheaply before any decode.
    """
    total = len(data)
    pos = start
    while pos + FRAME.size <= total:
        length, crc = FRAME.unpack_from(data, pos)
        end = pos + FRAME.size + length
        if length <= MAX_RECORD_BYTES and end <= total and zlib.crc32(data[pos + FRAME.size : end]) == crc:
            try:
                payload = decode_payload(data[pos + FRAME.size : end])
            except Exception:  # garbage that happened to match a CRC
                payload = None
            if isinstance(payload, dict) and predicate(payload):
                return pos
        pos += 1
    return None
