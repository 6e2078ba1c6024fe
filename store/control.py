"""Control records: requests for whichever supervisor holds a session's lease.

``sessions/<id>/control`` holds framed records ``{seq, id, ts, kind, ...}``
appended under the session lock and fsync'd before ``request`` returns, so a
request is acknowledged only once durable. Today the one kind is
``interrupt`` (cancel the current turn), written by a process that does not
hold the child's activation — another supervisor, the CLI.

The lease holder polls the file's size and applies records it has not seen;
records older than its activation are ignored (an interrupt is about the
turn running when it was asked, never a later one). Not guaranteed: a
request that lands while the holder is releasing the lease finds no turn to
stop; that is the same outcome as interrupting an inactive child (a no-op).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from .appender import append_durably
from .atomic import read_bytes
from .errors import SessionNotFoundError
from .framing import scan
from .ids import IdGenerator
from .root import Store

__all__ = ["ControlRecord", "request", "read_controls", "control_size"]


@dataclass(frozen=True)
class ControlRecord:
    seq: int
    id: str
    ts: float
    kind: str
    data: dict[str, Any]


def request(store: Store, session_id: str, kind: str, data: dict[str, Any], *, ids: IdGenerator) -> str:
    """Durably append a control record; returns its id."""
    if not store.exists(session_id):
        raise SessionNotFoundError(session_id)
    record_id = ids.new()
    record = {"id": record_id, "ts": time.time(), "kind": kind, "data": data}
    append_durably(store, store.path(session_id, "control"), record, lock_path=store.path(session_id, ".lock"),
                   key=f"control/{session_id}", owner=session_id, what=f"control of {session_id}")
    return record_id


def read_controls(store: Store, session_id: str, *, after_seq: int = -1) -> list[ControlRecord]:
    try:
        data = read_bytes(store.path(session_id, "control"))
    except FileNotFoundError:
        return []
    return [
        ControlRecord(r["seq"], str(r.get("id")), float(r.get("ts", 0.0)), str(r.get("kind")), dict(r.get("data") or {}))
        for r in scan(data).records
        if r["seq"] > after_seq
    ]


def control_size(store: Store, session_id: str) -> int:
    try:
        return os.stat(store.path(session_id, "control")).st_size
    except FileNotFoundError:
        return 0
