"""Raw access to a session's file for tests that damage or inspect bytes (store format 3).

A session is one file ``sessions/<id>``: preamble, two lease slots, header, then the log
(``store/session_file.py``). Tests that used to write ``sessions/<id>/log`` write the log
region through these helpers, at log offsets (relative to the log's start), so a damaged
byte lands where the store's own offsets (``Damage.offset``, projections) say it is.

A log's writer pads the file with zeros to a 4 KiB boundary (FORMAT.md §3.4): ``log_bytes``
is the whole region, padding included; ``log_data`` is its records alone (what a log held
before padding), and ``append_log`` drops the padding first, so the appended bytes follow
the last record exactly as they did in an unpadded file.
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from typing import Any

import msgpack

from subagents.store import Store
from subagents.store.framing import FRAME, encode_record
from subagents.store.session_file import HEADER_AT, SLOT_SIZE, SLOTS_AT, SessionFile, decode_slots
from subagents.store.lease_record import Lease
from subagents.store.reader import scan_events
from subagents.store.root import COMPANIONS

__all__ = [
    "files_of", "age",
    "log_start", "log_bytes", "zero_records_from", "cut_at_record", "log_data", "log_data_end", "write_log", "append_log", "file_bytes", "lease_slots", "patch", "header_map", "write_header",
    "write_header_value", "slot_bytes", "slot_records", "write_slot", "newest_slot", "synced_slot", "HEADER_AT", "SLOT_SIZE",
    "SLOTS_AT",
]


def log_start(st: Store, session_id: str) -> int:
    """The file offset of the log's byte 0."""
    with SessionFile.open(session_id, st.session_path(session_id)) as file:
        return file.data_start


def log_bytes(st: Store, session_id: str) -> bytes:
    with open(st.session_path(session_id), "rb") as handle:
        return handle.read()[log_start(st, session_id):]


def write_log(st: Store, session_id: str, data: bytes) -> None:
    """Replace the whole log region with ``data`` (preamble, lease and header kept)."""
    start = log_start(st, session_id)
    with open(st.session_path(session_id), "r+b") as handle:
        handle.seek(start)
        handle.write(data)
        handle.truncate(start + len(data))


def log_data_end(st: Store, session_id: str) -> int:
    """Where the log's zero padding starts (the region's length when it has none, or when it reads damaged)."""
    data = log_bytes(st, session_id)
    result = scan_events(data)
    return result.end if result.damage is None else len(data)


def log_data(st: Store, session_id: str) -> bytes:
    """The log region without its zero padding."""
    return log_bytes(st, session_id)[: log_data_end(st, session_id)]


def append_log(st: Store, session_id: str, data: bytes) -> None:
    """Cut the log's padding off, then append ``data`` to the file (bytes right after the last record)."""
    os.truncate(st.session_path(session_id), log_start(st, session_id) + log_data_end(st, session_id))
    with open(st.session_path(session_id), "ab") as handle:
        handle.write(data)


def file_bytes(st: Store, session_id: str) -> bytes:
    with open(st.session_path(session_id), "rb") as handle:
        return handle.read()


def lease_slots(st: Store, session_id: str) -> Lease | None:
    """The lease the two slots hold, read the way the store reads them."""
    with open(st.session_path(session_id), "rb") as handle:
        handle.seek(SLOTS_AT)
        return decode_slots(handle.read(2 * SLOT_SIZE)).lease


def patch(st: Store, session_id: str, offset: int, data: bytes) -> None:
    """Overwrite bytes at a *file* offset (the preamble, a lease slot, the header)."""
    fd = os.open(st.session_path(session_id), os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def zero_records_from(st: Store, session_id: str, index: int) -> None:
    """Zero the log's records from record ``index`` (negative: counted from the last) to their end, in
    place: the log then reads clean, ending before them (zeros read as its padding)."""
    from subagents.store import inspect

    found = inspect(st, session_id)
    start = log_start(st, session_id) + found.offsets[index]
    patch(st, session_id, start, bytes(log_start(st, session_id) + found.end - start))


def cut_at_record(st: Store, session_id: str, index: int) -> None:
    """Cut the file where record ``index`` (negative: counted from the last) starts: a clean record boundary."""
    from subagents.store import inspect

    os.truncate(st.session_path(session_id), log_start(st, session_id) + inspect(st, session_id).offsets[index])


def header_map(st: Store, session_id: str) -> object:
    """The session's header map as stored (not validated)."""
    with SessionFile.open(session_id, st.session_path(session_id)) as file:
        return file.header_map


def write_header(st: Store, session_id: str, body: bytes) -> None:
    """Replace the header with one frame of ``body`` (any bytes: it is not validated), the log kept
    after it and ``data_start`` moved to match: a header that frames and passes its CRC, so whatever
    is wrong with it is its content."""
    raw = file_bytes(st, session_id)
    log = raw[log_start(st, session_id):]
    head = FRAME.pack(len(body), zlib.crc32(body)) + body
    with open(st.session_path(session_id), "r+b") as handle:
        handle.write(raw[:4] + struct.pack("<I", HEADER_AT + len(head)) + raw[SLOTS_AT:HEADER_AT] + head + log)
        handle.truncate()


def write_header_value(st: Store, session_id: str, value: object) -> None:
    """``write_header`` of ``value`` packed as msgpack (a header of any shape or type)."""
    write_header(st, session_id, msgpack.packb(value, use_bin_type=True))


def slot_bytes(payload: dict[str, Any]) -> bytes:
    """A lease slot holding ``payload`` framed and CRC'd (valid as bytes, whatever it says)."""
    frame = encode_record(payload)
    assert len(frame) <= SLOT_SIZE, len(frame)
    return frame + bytes(SLOT_SIZE - len(frame))


def slot_records(st: Store, session_id: str) -> list[dict[str, Any] | None]:
    """What each slot decodes to as a record (``None``: empty or damaged), unvalidated."""
    raw = file_bytes(st, session_id)[SLOTS_AT:HEADER_AT]
    out: list[dict[str, Any] | None] = []
    for i in (0, 1):
        slot = raw[i * SLOT_SIZE:(i + 1) * SLOT_SIZE]
        length, crc = FRAME.unpack_from(slot)
        body = slot[FRAME.size:FRAME.size + length]
        try:
            record = msgpack.unpackb(body, raw=False) if len(body) == length and zlib.crc32(body) == crc else None
        except ValueError:
            record = None
        out.append(record if isinstance(record, dict) else None)
    return out


def write_slot(st: Store, session_id: str, index: int, data: bytes) -> None:
    """Overwrite lease slot ``index`` (0 or 1) with ``data``, zero-padded to the slot's size."""
    assert index in (0, 1) and len(data) <= SLOT_SIZE
    patch(st, session_id, SLOTS_AT + index * SLOT_SIZE, data + bytes(SLOT_SIZE - len(data)))


def newest_slot(st: Store, session_id: str) -> int:
    """The slot holding the newest record (highest ``gen``), the one readers take."""
    records = slot_records(st, session_id)
    return max((i for i in (0, 1) if records[i] is not None), key=lambda i: records[i]["gen"])  # type: ignore[index]


def synced_slot(st: Store, session_id: str) -> int | None:
    """The slot holding the newest ``synced`` record (an acquisition), which no write may replace."""
    records = slot_records(st, session_id)
    synced = [i for i in (0, 1) if records[i] is not None and records[i].get("synced") is True]  # type: ignore[union-attr]
    return max(synced, key=lambda i: records[i]["gen"]) if synced else None  # type: ignore[index]


def files_of(st: Store, session_id: str) -> list[str]:
    """The session's file and the companions it has (``sessions/<id>``, ``sessions/<id>.<name>``)."""
    paths = [st.session_path(session_id)] + [st.path(session_id, name) for name in COMPANIONS]
    return [p for p in paths if os.path.lexists(p)]


def age(st: Store, session_id: str, seconds: float) -> None:
    """Set every file of the session back ``seconds``: its last activity (what ``gc`` reads) was then."""
    when = time.time() - seconds
    for path in files_of(st, session_id):
        os.utime(path, (when, when), follow_symlinks=False)
