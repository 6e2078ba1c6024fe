"""Raw access to a session's file for tests that damage or inspect bytes (store format 2).

A session is one file ``sessions/<id>``: preamble, two lease slots, header, then the log
(``store/session_file.py``). Tests that used to write ``sessions/<id>/log`` write the log
region through these helpers, at log offsets (relative to the log's start), so a damaged
byte lands where the store's own offsets (``Damage.offset``, projections) say it is.
"""

from __future__ import annotations

import os

from subagents.store import Store
from subagents.store.session_file import HEADER_AT, SLOT_SIZE, SLOTS_AT, SessionFile, decode_slots
from subagents.store.lease_record import Lease

__all__ = ["log_start", "log_bytes", "write_log", "append_log", "file_bytes", "lease_slots", "patch", "HEADER_AT", "SLOT_SIZE", "SLOTS_AT"]


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


def append_log(st: Store, session_id: str, data: bytes) -> None:
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
