"""Control records: requests for whichever supervisor holds a session's lease.

``sessions/<id>.control`` holds framed records ``{seq, id, ts, kind, ...}``
appended under the session lock and fsync'd before ``request`` returns, so a
request is acknowledged only once durable (``FORMAT.md`` §8.1). The kinds are
``interrupt`` (cancel the current turn) and ``drain`` (tear the activation
down), written by a process that does not hold the child's activation —
another supervisor, the CLI.

The lease holder polls the file's size and applies records it has not seen:
a continuable activation ignores records older than itself (an interrupt is
about the turn running when it was asked, never a later one); a one-shot
run, which has one turn, applies every record. Not guaranteed: a
request that lands while the holder is releasing the lease finds no turn to
stop; that is the same outcome as interrupting an inactive child (a no-op).

Reading never raises for damage: a record of the wrong shape (checked by
``store/records.py``) comes back as a ``ControlRecord`` of kind ``invalid``
with its problem, in its place, so the holder reports it once, moves past
its seq and applies the records after it; a run of damaged bytes is stepped
over (``framing.scan_all``); an unreadable file reads as no records.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from .appender import append_durably
from .extent import skim_path
from .errors import SessionNotFoundError
from .ids import IdGenerator
from .records import ControlFields, problem_of
from .root import Store
from .session_file import SessionLock

__all__ = ["ControlRecord", "INVALID", "request", "read_controls", "control_size"]

log = logging.getLogger(__name__)

# The kind of a record that failed its check; no request is ever written with it.
INVALID = "invalid"

_problem = problem_of(ControlFields)


@dataclass(frozen=True)
class ControlRecord:
    seq: int
    id: str
    ts: float
    kind: str
    data: dict[str, Any]
    problem: str | None = None  # set (and kind == INVALID) for a record that failed its check


def request(store: Store, session_id: str, kind: str, data: dict[str, Any], *, ids: IdGenerator, lock_timeout: float | None = None) -> str:
    """Durably append a control record; returns its id. ``lock_timeout``: the longest to wait for the
    session's lock, then ``LockTimeoutError`` with nothing written; ``None``: wait for it."""
    if not store.exists(session_id):
        raise SessionNotFoundError(session_id)
    if kind == INVALID:
        raise ValueError(f'"{INVALID}" is not a control request kind')
    record_id = ids.new()
    record = {"id": record_id, "ts": time.time(), "kind": kind, "data": data}
    lock = SessionLock(session_id, store.session_path(session_id), timeout=lock_timeout)
    try:
        append_durably(store, store.path(session_id, "control"), record, lock=lock,
                       key=f"control/{session_id}", owner=session_id, what=f"control of {session_id}", skip_damage=True)
    finally:
        lock.close()
    return record_id


def read_controls(store: Store, session_id: str, *, after_seq: int = -1) -> list[ControlRecord]:
    """Records with ``seq > after_seq`` in seq order; a damaged one as kind ``INVALID`` in its place."""
    try:
        skim = skim_path(store.path(session_id, "control"), check=_problem)  # bounded by its records
    except FileNotFoundError:
        return []
    except OSError as exc:  # a folder or a link in its place: nothing to apply (fsck reports it;
        # debug only: the holder polls this file, and a warning would repeat every poll)
        log.debug("control file of %s cannot be read: %s", session_id, exc, extra={"session": session_id})
        return []
    out = [
        ControlRecord(r["seq"], r["id"], float(r["ts"]), r["kind"], dict(r.get("data") or {}))
        for r in skim.records
        if r["seq"] > after_seq
    ]
    for skipped in skim.skipped:
        problem = f"{skipped.damage.reason} at byte {skipped.damage.offset}" + (f" ({skipped.damage.detail})" if skipped.damage.detail else "")
        for seq in skipped.seqs:
            if seq > after_seq:
                log.warning("control record %d of %s skipped: %s", seq, session_id, problem, extra={"session": session_id})
                out.append(ControlRecord(seq, "", 0.0, INVALID, {}, problem))
    out.sort(key=lambda r: r.seq)
    return out


def control_size(store: Store, session_id: str) -> int:
    try:
        return os.lstat(store.path(session_id, "control")).st_size
    except OSError:
        return 0
