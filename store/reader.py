"""The read-only side of a session: header, valid log prefix, classification.

``inspect`` never changes a byte (no truncation, no cache write). It
classifies the log as:

* ``clean``   — every byte is a valid record, or the zero padding after the last one;
* ``torn``    — the valid prefix is followed by bytes of a write that never
  committed: no valid ``turn/end`` record can be found after the damage, so
  nothing committed is lost by dropping them (the resume path truncates them);
* ``corrupt`` — a valid ``turn/end`` record exists beyond the damage: bytes
  inside the committed region are bad, and dropping them would lose committed
  work. Nothing repairs this silently.

Every event passes the envelope check of ``store/records.py`` (a record whose
``type`` is not a string, or whose ``ts`` is not a finite number, is damage
like a bad CRC). Nothing here raises anything but a ``SubagentError``: an
unreadable file (a folder or a link in its place) is ``UnavailableSessionError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from .atomic import read_bytes
from .errors import (
    CorruptSessionError,
    InvalidHeaderError,
    UnavailableSessionError,
    UnsupportedFormatError,
)
from .events import unknown_type
from .extent import Beyond
from .framing import Damage, ScanResult, scan, torn_tail
from .header import SessionHeader, parse_header
from .records import event_problem
from .root import Store
from .session_file import SessionFile

__all__ = [
    "LogStatus", "Inspection", "read_session_file", "open_session", "header_of", "read_header", "read_log", "scan_events", "scan_log",
    "classify", "committed_damage", "lost_damage", "inspect", "inspect_error_kind", "inspect_file", "read_from",
]

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


def read_session_file(
    store: Store, session_id: str, name: str, *, offset: int = 0, stop: Callable[[int], int] | None = None,
) -> bytes | None:
    """The bytes of the companion file ``sessions/<id>.<name>`` (``None`` when absent);
    ``UnavailableSessionError`` when unreadable. ``stop`` as ``read_bytes``."""
    try:
        return read_bytes(store.path(session_id, name), offset=offset, stop=stop)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnavailableSessionError.of(session_id, f"its {name} cannot be read", exc) from None


def open_session(store: Store, session_id: str, *, write: bool = False) -> SessionFile:
    """The session's file, its preamble read (``store/session_file.py`` says what it raises)."""
    return SessionFile.open(session_id, store.session_path(session_id), write=write, record_limit=store.max_record_bytes)


def header_of(file: SessionFile) -> SessionHeader:
    """The validated header of an open session file; ``CorruptSessionError`` or ``UnsupportedFormatError``."""
    data = file.header_map
    try:
        return parse_header(data, expected_id=file.session_id)
    except InvalidHeaderError as exc:
        raise CorruptSessionError(file.session_id, exc.message) from None


def read_header(store: Store, session_id: str) -> SessionHeader:
    """The validated header; ``SessionNotFoundError``, ``CorruptSessionError``,
    ``UnavailableSessionError`` or ``UnsupportedFormatError``, nothing else."""
    with open_session(store, session_id) as file:
        return header_of(file)


def read_log(file: SessionFile, offset: int = 0) -> tuple[bytes, Beyond | None]:
    """The log region of an open session file from ``offset``, read in bounded memory
    (``SessionFile.read_records``); ``UnavailableSessionError`` when unreadable."""
    try:
        return file.read_records(offset)
    except OSError as exc:
        raise UnavailableSessionError.of(file.session_id, "its log cannot be read", exc) from None


# the records that end a committed write in every log: a turn's end, and a drain's or an
# interrupt's discards (cutting those would run again the messages they dropped)
_COMMITS = frozenset({"turn/end", "message/discarded"})
# and in a root's log, which runs no turn: its takes (``take_messages``), each one committed before
# the messages it took are handed out (cutting them would deliver those messages again)
_ROOT_COMMITS = _COMMITS | {"message/accepted"}


def _commits(payload: dict[str, Any]) -> bool:
    return payload.get("type") in _COMMITS


def _root_commits(payload: dict[str, Any]) -> bool:
    return payload.get("type") in _ROOT_COMMITS


def classify(data: bytes, damage: Damage | None, expected_seq: int = 0, *, root: bool = False, beyond: Beyond | None = None) -> LogStatus:
    """``corrupt`` unless the damage is a torn tail by the rule the mailbox uses too (``framing.torn_tail``):
    no commit point chains after it. A log's commit points are its ``turn/end`` and ``message/discarded``
    records, and a root's (``root``: a session with no parent) its ``message/accepted`` ones too.
    ``beyond``: ``data`` is a bounded read and more data follows it; the commit point is looked for
    there (in the file, a window at a time, holes skipped), not in ``data``."""
    if damage is None:
        return "clean"
    commits = _root_commits if root else _commits
    if beyond is not None:  # rule 2 only (a log knows no checkpoint, and not every record commits)
        found = beyond.find_committed(damage.offset + 1, expected_seq, commits, torn_reason=damage.reason)
        return "torn" if found is None else "corrupt"
    return "torn" if torn_tail(data, damage, expected_seq, commits=commits, padded=True) else "corrupt"


def committed_damage(session_id: str, damage: Damage) -> CorruptSessionError:
    """The error of a log whose damage ``classify`` calls ``corrupt``: where and why, for a reader
    that needs the whole log (a writer opening it, ``subagents show``), never its prefix alone."""
    detail = f" ({damage.detail})" if damage.detail else ""
    return CorruptSessionError(session_id, f"{damage.reason} at byte {damage.offset} in the committed region{detail}",
                               offset=damage.offset)


def lost_damage(end: int, committed: int, damage: Damage | None) -> Damage:
    """What a log whose valid records stop at ``end``, before ``committed`` (where its parent's index
    says they reach, ``store/committed.py``), lost: the damage found where they stop (a torn-looking
    tail), else the records missing after them."""
    return damage or Damage(end, committed - end, "records-missing",
                            f"its settled row says its records end at byte {committed} of its log")


def scan_events(data: bytes | memoryview, *, start_seq: int = 0, base_offset: int = 0, beyond: Beyond | None = None) -> ScanResult:
    """``framing.scan`` of log events, each checked against the event envelope; an all-zero
    remainder is the log's padding (its end), not damage (FORMAT.md §3.4), unless ``beyond`` says
    more data follows ``data`` (a bounded read)."""
    return scan(data, start_seq=start_seq, base_offset=base_offset, check=event_problem, padded=True,
                last=None if beyond is None else beyond.last)


def scan_log(
    session_id: str, data: bytes, *, start_seq: int = 0, base_offset: int = 0, root: bool = False, beyond: Beyond | None = None,
) -> tuple[list[dict[str, Any]], list[int], int, Damage | None, LogStatus]:
    """The events of ``data`` (the log from ``base_offset``, a record boundary), checked, and their damage
    classified; ``beyond``: what ``SessionFile.read_records`` says lies past ``data``."""
    result = scan_events(data, start_seq=start_seq, base_offset=base_offset, beyond=beyond)
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
        status = classify(data, local, start_seq + len(result.records), root=root, beyond=beyond)
    return result.records, result.offsets, result.end, result.damage, status


def inspect_error_kind(code: str) -> Literal["unsupported", "unreadable", "header-corrupt"]:
    """What an ``inspect`` error (its code) says of a session, as ``check`` and ``fsck`` report it: a format
    this build does not know, a file that cannot be read now (or whose lock a stuck holder keeps), or a
    damaged header."""
    if code == "UNSUPPORTED_FORMAT":
        return "unsupported"
    if code in ("SESSION_UNAVAILABLE", "LOCK_TIMEOUT"):
        return "unreadable"
    return "header-corrupt"


def inspect(store: Store, session_id: str, *, locked: bool = False) -> Inspection:
    """Header and valid prefix of a session, classified; read-only.

    An append in flight is not all there to a reader without the session lock (a ``pwrite`` is
    copied into the page cache while the reader copies out of it, and a reader overtaken by the
    writer sees the batch's later bytes over zeros) and can look like damage with a ``turn/end``
    after it. So a log read as ``corrupt`` is read again under the session lock, taken only then,
    where no append is in flight (waited for under ``LOCK_TIMEOUT_S``, then ``LockTimeoutError``),
    as the mailbox's readers do. ``locked``: the caller holds the session lock, and its first read
    is final (``flock`` would wait for the caller's own other descriptor).
    """
    with open_session(store, session_id) as file:
        found = inspect_file(file)
        if not locked and found.status == "corrupt":
            file.lock(bounded=True)  # a stuck holder: LockTimeoutError, not a reader hung for good
            try:
                found = inspect_file(file)
            finally:
                file.unlock()
        return found


def inspect_file(file: SessionFile, header: SessionHeader | None = None) -> Inspection:
    """``inspect`` of a session file its caller has open (and reads more of); ``header``: its header, when
    the caller has validated it already (a listing row reads it first), not validated again."""
    header = header_of(file) if header is None else header
    data, beyond = read_log(file)
    events, offsets, end, damage, status = scan_log(file.session_id, data, root=header.parent_session is None, beyond=beyond)
    # the log's size, not what was read: a file extended with zeros (or a stray byte) is read only as far as its records reach
    return Inspection(header, events, offsets, end, max(len(data), file.log_size()), status, damage)


def read_from(store: Store, session_id: str, from_seq: int, *, locked: bool = False) -> list[dict[str, Any]]:
    """The stored events with ``seq >= from_seq`` of the valid prefix; read-only.

    Like ``inspect`` (``locked`` is its) it never truncates nor appends closers: an open turn reads open.
    """
    if from_seq < 0:
        raise ValueError("from_seq must be >= 0")
    return inspect(store, session_id, locked=locked).events[from_seq:]
