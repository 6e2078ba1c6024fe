"""The read-only side of a session: header, valid log prefix, classification.

``inspect`` never changes a byte (no truncation, no cache write). It
classifies the log as:

* ``clean``   — every byte is a valid record;
* ``torn``    — the valid prefix is followed by bytes of a write that never
  committed: no valid ``turn/end`` record can be found after the damage, so
  nothing committed is lost by dropping them (the resume path truncates them);
* ``corrupt`` — a valid ``turn/end`` record exists beyond the damage: bytes
  inside the committed region are bad, and dropping them would lose committed
  work. Nothing repairs this silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import msgpack

from .atomic import read_bytes
from .errors import CorruptSessionError, InvalidHeaderError, SessionNotFoundError, UnsupportedFormatError
from .events import unknown_type
from .framing import Damage, find_later_record, scan
from .header import SessionHeader, parse_header
from .root import Store

__all__ = ["LogStatus", "Inspection", "read_header", "scan_log", "classify", "inspect", "read_from"]

LogStatus = Literal["clean", "torn", "corrupt"]


@dataclass(frozen=True)
class Inspection:
    header: SessionHeader
    events: list[dict[str, Any]]
    offsets: list[int]
    end: int  # byte length of the valid prefix
    size: int  # byte length of the file
    status: LogStatus
    damage: Damage | None

    @property
    def next_seq(self) -> int:
        return len(self.events)


def read_header(store: Store, session_id: str) -> SessionHeader:
    """The validated header; ``SessionNotFoundError``, ``CorruptSessionError`` or ``UnsupportedFormatError``."""
    path = store.path(session_id, "header")
    try:
        raw = read_bytes(path)
    except FileNotFoundError:
        raise SessionNotFoundError(session_id) from None
    try:
        data = msgpack.unpackb(raw, raw=False)
    except Exception as exc:  # garbage bytes
        raise CorruptSessionError(session_id, f"header is not msgpack ({type(exc).__name__})") from None
    try:
        return parse_header(data, expected_id=session_id)
    except InvalidHeaderError as exc:
        raise CorruptSessionError(session_id, exc.message) from None


def _is_turn_end(payload: dict[str, Any]) -> bool:
    return payload.get("type") == "turn/end"


def classify(data: bytes, damage: Damage | None) -> LogStatus:
    if damage is None:
        return "clean"
    return "corrupt" if find_later_record(data, damage.offset + 1, _is_turn_end) is not None else "torn"


def scan_log(session_id: str, data: bytes, *, start_seq: int = 0, base_offset: int = 0) -> tuple[list[dict[str, Any]], list[int], int, Damage | None, LogStatus]:
    result = scan(data, start_seq=start_seq, base_offset=base_offset)
    for event in result.records:
        kind = unknown_type(event)
        if kind is not None:
            raise UnsupportedFormatError(
                f'session "{session_id}" holds event type "{kind}" that this build cannot read',
                session_id=session_id,
                event_type=kind,
            )
    status: LogStatus = "clean"
    if result.damage is not None:
        local = Damage(result.damage.offset - base_offset, result.damage.dropped, result.damage.reason, result.damage.detail)
        status = classify(data, local)
    return result.records, result.offsets, result.end, result.damage, status


def inspect(store: Store, session_id: str) -> Inspection:
    """Header and valid prefix of a session, classified; read-only."""
    header = read_header(store, session_id)
    try:
        data = read_bytes(store.path(session_id, "log"))
    except FileNotFoundError:
        data = b""
    events, offsets, end, damage, status = scan_log(session_id, data)
    return Inspection(header, events, offsets, end, len(data), status, damage)


def read_from(store: Store, session_id: str, from_seq: int) -> list[dict[str, Any]]:
    """The stored events with ``seq >= from_seq`` of the valid prefix; read-only.

    Like ``inspect`` it never truncates nor appends closers: an open turn reads open.
    """
    if from_seq < 0:
        raise ValueError("from_seq must be >= 0")
    return inspect(store, session_id).events[from_seq:]
