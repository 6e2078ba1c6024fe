"""Framed msgpack records: the one record format of every append-only store file.

A record is ``u32 LE length`` + ``u32 LE CRC32(payload)`` + ``payload``, the
payload a msgpack map holding a contiguous integer ``seq`` (FORMAT.md). The
writer side is ``encode_record``; the reader side is ``scan``, which never
raises: it returns the valid prefix and, when the bytes stop being valid,
a ``Damage`` value saying where, how many bytes were dropped and why — the
caller decides whether that is a torn tail or corruption (LevelDB's Reporter).

Zero padding: a session log and a mailbox may end in zero bytes (FORMAT.md
§3.4, §8): their writers pad the file to the next 4 KiB boundary so that
later appends overwrite bytes in place. ``scan(..., padded=True)`` (and
``find_committed``) read an all-zero remainder at a record boundary as the
end, not as damage; the control file and the indexes are scanned with
``padded=False``, as before. ``zeros_from`` is the one test of "only zeros
from here on" (padding, or nothing written since).

Sizes: ``MAX_RECORD_BYTES`` is the format's ceiling, shared by every reader
and writer: a length above it is damage, never a record. A store may set a
lower limit for its writers (``Store.max_record_bytes``), never a higher one,
so every record a writer accepted is one every reader reads. A record above
the writer's limit is refused by ``encode_record`` before a byte is written.

Why a little over 500 lines in one module: the forward scan, the backward
suffix scan of the indexes, the committed-end search and the padding rules
are one definition of what a valid frame is; split, each part would need the
others' private helpers, and a change to the rules could miss one of them.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import msgpack

from .errors import InvalidRecordError, OutOfMemoryError, RecordTooLargeError

__all__ = [
    "BLOCK",
    "FRAME",
    "MAX_RECORD_BYTES",
    "DEFAULT_RECORD_LIMIT",
    "MIN_RECORD_LIMIT",
    "Check",
    "encode_record",
    "RecordEncoder",
    "decode_payload",
    "Damage",
    "ScanResult",
    "scan",
    "Skipped",
    "SkimResult",
    "scan_all",
    "scan_clean",
    "scan_suffix",
    "find_committed",
    "torn_tail",
    "data_end",
    "zeros_from",
]

FRAME = struct.Struct("<II")
# A length above this is treated as damage, not as a real record: it bounds the
# memory a corrupt length field can make a reader allocate.
MAX_RECORD_BYTES = 64 * 1024 * 1024
# What a store's writers accept unless its marker says otherwise: big enough for any
# message or tool result a model produces, small enough that a reader folding a log
# never holds more than this per record.
DEFAULT_RECORD_LIMIT = 16 * 1024 * 1024
# The smallest limit a store may keep: below it, a session's header and a turn's records hardly fit.
MIN_RECORD_LIMIT = 1024
# A padded file (a session's log, a mailbox) is padded with zeros to a multiple of this many bytes (a page, a block).
BLOCK = 4096

# A record's typed check (store/records.py): the problem as text, or None when valid.
Check = Callable[[dict[str, Any]], "str | None"]


def _refuse(body: bytes, limit: int, what: str, event: str | None = None) -> None:
    raise RecordTooLargeError(what, size=len(body), limit=limit, event=event)


# what msgpack raises for a value it cannot encode (an object, a set, a lone surrogate, an int over 64 bits)
_ENCODE_ERRORS = (TypeError, ValueError, OverflowError)


def encode_record(payload: dict[str, Any], *, limit: int = MAX_RECORD_BYTES, what: str = "record", event: str | None = None) -> bytes:
    """Frame ``payload``; ``RecordTooLargeError`` (nothing framed, naming ``event``, the type of the log event
    ``payload`` is, when it is one) when it is above ``limit``, ``InvalidRecordError`` when msgpack cannot encode it."""
    try:
        body = msgpack.packb(payload, use_bin_type=True)
    except _ENCODE_ERRORS as exc:
        raise InvalidRecordError.unencodable(what, exc) from None
    except MemoryError as exc:
        raise OutOfMemoryError(what) from exc
    if len(body) > limit:
        _refuse(body, limit, what, event)
    return _framed(body, what)


def _framed(body: bytes, what: str) -> bytes:
    """``body`` behind its frame header. A ``MemoryError`` framing (here or in the encoding) comes before any
    write, so it is ``OutOfMemoryError``: nothing was stored (a big record takes a few times its size)."""
    try:
        return FRAME.pack(len(body), zlib.crc32(body)) + body
    except MemoryError as exc:
        raise OutOfMemoryError(what) from exc


_PACK_BUFFER = 4096


class RecordEncoder:
    """``encode_record`` with one reusable msgpack ``Packer``.

    ``msgpack.packb`` builds a new ``Packer`` on every call; a log writer frames
    every event it appends, so it keeps one. Not thread-safe (neither is a writer).
    Its buffer starts at 4 KiB (it grows for a larger record), not msgpack's
    256 KiB: a worker opens a writer per one-shot child, and a 256 KiB block
    freed at the heap's top is handed back to the kernel, so the next writer's
    cost a ``brk`` and fresh pages again.
    """

    __slots__ = ("_pack", "limit")

    def __init__(self, limit: int = MAX_RECORD_BYTES) -> None:
        self._pack = msgpack.Packer(use_bin_type=True, buf_size=_PACK_BUFFER).pack
        self.limit = limit

    def __call__(self, payload: dict[str, Any]) -> bytes:
        try:
            body = self._pack(payload)
        except _ENCODE_ERRORS as exc:
            raise InvalidRecordError.unencodable(_event_what(payload), exc) from None
        except MemoryError as exc:  # before any write, as ``encode_record``'s
            raise OutOfMemoryError(_event_what(payload)) from exc
        if len(body) > self.limit:  # the message is built only here: the hot path pays one comparison
            kind = payload.get("type")
            _refuse(body, self.limit, _event_what(payload), kind if isinstance(kind, str) else None)
        return _framed(body, _event_what(payload))


def _event_what(payload: dict[str, Any]) -> str:
    kind = payload.get("type")
    return f'a "{kind}" event' if isinstance(kind, str) else "a record"


def decode_payload(body: bytes | memoryview) -> Any:
    return msgpack.unpackb(body, raw=False, strict_map_key=False)


@dataclass(frozen=True)
class Damage:
    """Where the valid prefix ends and why.

    ``reason`` is one of ``short-header``, ``short-payload``, ``bad-length``,
    ``crc-mismatch``, ``undecodable``, ``not-a-record``, ``seq-gap``. ``dropped``: the bytes from ``offset``
    on, in a padded file (a log, a mailbox) to its last non-zero byte: its zero padding is no data.
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


def _frame_at(data: bytes | memoryview, pos: int, check: Check | None = None) -> tuple[str, Any, int]:
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
    if check is not None:
        problem = check(payload)
        if problem is not None:
            return "not-a-record", problem, total
    return "ok", payload, start + length


def data_end(data: bytes | memoryview) -> int:
    """Where the all-zero remainder of ``data`` begins (``len(data)`` when its last byte is not zero).

    A record's own last bytes may be zeros (an ``epoch`` of 0 ends its map), so
    this is a bound, not a record boundary: a frame that ends at or after it
    has nothing but zeros behind it.
    """
    stop, step = len(data), 4096  # the padding is short: look at the last block first, never copy the whole log
    while stop > 0:
        start = max(0, stop - step)
        kept = bytes(data[start:stop]).rstrip(b"\0")
        if kept:
            return start + len(kept)
        stop, step = start, step * 2
    return 0


def zeros_from(data: bytes | memoryview, pos: int = 0) -> bool:
    """Whether every byte of ``data`` from ``pos`` on is zero (one C loop over the remainder)."""
    rest = data[pos:]
    if isinstance(rest, memoryview):
        rest = rest.tobytes()
    return rest.count(0) == len(rest)


def _padded_damage(data: bytes | memoryview, pos: int, status: str, detail: Any, last: int | None = None) -> tuple[str, Any] | None:
    """How a padded log reads damage at ``pos``: ``None`` for its all-zero end, else (reason, detail).
    ``last``: where the data ends (``scan``'s), when ``data`` stops short of it.

    Zeros to the end are padding (never a record: a payload is a non-empty map,
    so its length is never 0). A frame whose CRC fails and whose announced
    bytes run into the zeros is a write torn inside the padding: it is
    ``short-payload``, as the same write torn at the end of an unpadded file
    is, so that ``find_committed`` knows every byte after it is its own.
    """
    if data[pos] == 0 and (zeros_from(data, pos) if last is None else pos >= last):
        return None
    if status == "crc-mismatch":
        end = data_end(data) if last is None else last
        length, _ = FRAME.unpack_from(data, pos)
        if pos + FRAME.size + length > end:
            return "short-payload", f"need {length}, have {end - pos - FRAME.size} before the zero padding"
    return status, detail


def _dropped(data: bytes | memoryview, pos: int, padded: bool, last: int | None = None) -> int:
    """``Damage.dropped`` at ``pos``; counting the padding, a log said thousands of bytes followed its damage."""
    if not padded:
        return len(data) - pos
    return max(1, (data_end(data) if last is None else last) - pos)


def scan(
    data: bytes | memoryview, *, start_seq: int = 0, base_offset: int = 0, check: Check | None = None, padded: bool = False,
    last: int | None = None,
) -> ScanResult:
    """Read records from ``data`` until the first invalid one.

    ``start_seq`` is the seq the first record must carry (records are
    contiguous); ``base_offset`` is added to reported offsets when ``data``
    is a suffix of a file; ``check`` is the record kind's typed check
    (``store/records.py``): a record that fails it is damage (``not-a-record``).
    ``padded``: ``data`` is (a suffix of) a session log or a mailbox, which may end in
    zero padding: an all-zero remainder where a record would start is its
    end (``end`` is where the zeros start, no damage). ``last`` (padded only): where the data ends, relative
    to ``data``, when ``data`` is a bounded read that stopped short of it (``store/extent.py: read_records``):
    zeros to the end of ``data`` are then no end, and ``dropped`` counts to ``last``.
    """
    records: list[dict[str, Any]] = []
    offsets: list[int] = []
    total = len(data)
    pos, expected = _clean_run(data, start_seq, base_offset, check, records, offsets)
    if padded and last is None and pos < total and zeros_from(data, pos):
        # the padding after the records, as the loop below would find it (no frame reads there)
        return ScanResult(records, base_offset + pos, offsets, None)
    while pos < total:
        status, value, nxt = _frame_at(data, pos, check)
        if status != "ok":
            if padded and (data[pos] == 0 or status == "crc-mismatch"):
                found = _padded_damage(data, pos, status, value, last)
                if found is None:
                    break
                status, value = found
            return ScanResult(records, base_offset + pos, offsets, Damage(base_offset + pos, _dropped(data, pos, padded, last), status, value))
        if value["seq"] != expected:
            gap = Damage(base_offset + pos, _dropped(data, pos, padded, last), "seq-gap", f"expected {expected}, got {value['seq']}")
            return ScanResult(records, base_offset + pos, offsets, gap)
        records.append(value)
        offsets.append(base_offset + pos)
        expected += 1
        pos = nxt
    return ScanResult(records, base_offset + pos, offsets, None)


def _clean_run(
    data: bytes | memoryview, seq: int, base_offset: int, check: Check | None, records: list[dict[str, Any]], offsets: list[int],
) -> tuple[int, int]:
    """``scan``'s records from the start of ``data`` while each is one ``_frame_at`` reads ``ok`` with the
    expected seq, in one tight loop (appended to ``records`` and ``offsets``); where it stops and the seq
    due there. Anything else — padding, damage, a record that fails ``check`` — is left to ``scan``'s
    record-by-record loop, which goes on from that point as it would have had it read every record
    itself: every listing row folds its child's log, and the calls per record were half its cost."""
    view = memoryview(data)
    unpack_from, crc32, unpackb, head = FRAME.unpack_from, zlib.crc32, msgpack.unpackb, FRAME.size
    pos, total = 0, len(view)
    while total - pos >= head:
        length, crc = unpack_from(view, pos)
        start = pos + head
        end = start + length
        if length > MAX_RECORD_BYTES or end > total:
            break
        body = view[start:end]
        if crc32(body) != crc:
            break
        try:
            payload = unpackb(body, raw=False, strict_map_key=False)
        except Exception:  # msgpack raises several unrelated types for garbage: ``_frame_at`` says which
            break
        if type(payload) is not dict or type(payload.get("seq")) is not int or payload["seq"] != seq:
            break
        if check is not None and check(payload) is not None:
            break
        records.append(payload)
        offsets.append(base_offset + pos)
        seq += 1
        pos = end
    return pos, seq


@dataclass(frozen=True)
class Skipped:
    """Records ``scan_all`` stepped over: the seqs they held (as far as the chain tells) and why."""

    seqs: range
    damage: Damage


@dataclass(frozen=True)
class SkimResult:
    """Every record ``scan_all`` could reach, and the damage it stepped over."""

    records: list[dict[str, Any]]
    skipped: list[Skipped]  # damage with valid, chained records after it
    tail: Damage | None  # damage at the end with nothing chained after it (a torn tail)
    end: int  # byte offset after the last record read
    next_seq: int
    # whether ``tail`` is a torn tail (``torn_tail``), for a reader that asked (``extent.skim_file``); else None
    tail_torn: bool | None = None


def scan_all(data: bytes | memoryview, *, check: Check | None = None, start_seq: int = 0) -> SkimResult:
    """Read every record of a file whose records are independent (children index, control).

    Unlike ``scan`` it does not stop at the first damage: it looks for the next
    frame that chains (``find_committed``) and goes on from there, so one bad
    record never hides the ones after it. A record that is framed and sequenced
    right but fails ``check`` is skipped in place (its length is trustworthy:
    the CRC matched). Damage with nothing chained after it is the torn tail.
    ``start_seq``: the seq of ``data``'s first record (a file read on from a record it holds:
    ``store/extent.py: skim_file``).
    """
    whole = scan_clean(data, check=check, start_seq=start_seq)
    if whole is not None:
        return whole
    records: list[dict[str, Any]] = []
    skipped: list[Skipped] = []
    pos, expected, total = 0, start_seq, len(data)
    while pos < total:
        status, value, nxt = _frame_at(data, pos)
        if status == "ok" and value["seq"] == expected:
            problem = None if check is None else check(value)
            if problem is None:
                records.append(value)
            else:
                skipped.append(Skipped(range(expected, expected + 1), Damage(pos, nxt - pos, "not-a-record", problem)))
            expected += 1
            pos = nxt
            continue
        if status == "ok":
            status, value = "seq-gap", f"expected {expected}, got {value['seq']}"
        found = find_committed(data, pos + 1, expected, lambda _payload: True, torn_reason=status)
        if found is None:
            return SkimResult(records, skipped, Damage(pos, total - pos, status, value), pos, expected)
        resumed = _frame_at(data, found)[1]["seq"]
        skipped.append(Skipped(range(expected, resumed), Damage(pos, found - pos, status, value)))
        pos, expected = found, resumed
    return SkimResult(records, skipped, None, pos, expected)


def scan_clean(data: bytes | memoryview, *, check: Check | None = None, start_seq: int = 0,
               sink: Callable[[list[dict[str, Any]]], None] | None = None, part: bool = False) -> SkimResult | None:
    """``scan_all`` of records without damage whose first has seq ``start_seq`` (a file's bytes, or those
    appended after a point a reader already read), in one tight loop; ``None`` at the first anomaly (a
    torn or damaged record, one in flight): the caller then reads the whole file the careful way. A
    listing reads a whole children index per query, so a clean file must cost little more than its decoding.

    ``sink``: the records are handed to it a few hundred at a time, in order, and not kept (the result has
    none): a fold of a large file then never holds every record decoded at once. On ``None`` it has had
    some of them: the caller drops what it folded. ``part``: ``data`` is a part of the file read so far,
    and a frame it does not hold whole ends the scan there (``end``) instead of reading as torn: the
    caller reads on from that point with more bytes."""
    view = memoryview(data)
    unpack_from, crc32, unpackb = FRAME.unpack_from, zlib.crc32, msgpack.unpackb
    records: list[dict[str, Any]] = []
    pos, seq, total, head = 0, start_seq, len(view), FRAME.size
    while pos < total:
        if total - pos < head:
            if part:
                break
            return None
        length, crc = unpack_from(view, pos)
        start = pos + head
        end = start + length
        if length > MAX_RECORD_BYTES:
            return None
        if end > total:
            if part:
                break
            return None
        body = view[start:end]
        if crc32(body) != crc:
            return None
        try:
            payload = unpackb(body, raw=False, strict_map_key=False)
        except Exception:  # msgpack raises several unrelated types for garbage: the careful path says which
            return None
        if type(payload) is not dict or type(payload.get("seq")) is not int or payload["seq"] != seq:
            return None
        if check is not None and check(payload) is not None:
            return None
        records.append(payload)
        seq += 1
        pos = end
        if sink is not None and len(records) >= _SINK_BATCH:
            sink(records)
            records = []
    if sink is not None and records:
        sink(records)
        records = []
    return SkimResult(records, [], None, pos, seq)


_SINK_BATCH = 256  # records a ``scan_clean`` sink takes at a time: a few hundred KB decoded at most


def _chain(data: bytes | memoryview, pos: int, seq: int, limit: int = 2) -> tuple[int, int]:
    """How many valid frames with consecutive seqs start at ``pos`` (up to ``limit``), and where they end."""
    count = 0
    while count < limit:
        status, value, nxt = _frame_at(data, pos)
        if status != "ok" or value["seq"] != seq + count:
            break
        count += 1
        pos = nxt
    return count, pos


def find_committed(
    data: bytes | memoryview,
    start: int,
    expected_seq: int,
    predicate: Callable[[dict[str, Any]], bool],
    *,
    torn_reason: str,
    padded: bool = False,
    last: int | None = None,
    stop: int | None = None,
    limit: int = MAX_RECORD_BYTES,
) -> int | None:
    """The offset of the first frame at or after ``start`` that proves committed records follow damage.

    A candidate is a valid frame (length, CRC, msgpack map with a ``seq``)
    whose payload matches ``predicate``, whose seq continues the valid prefix
    (``>= expected_seq``), and that *chains*: the next frame follows it with
    seq + 1. A lone frame at the very end of the file chains too, except when
    the damage is ``short-payload`` or ``short-header``: then everything after
    the damage offset lies inside the cut record's own announced bytes, and a
    frame found there is data of that record (binary tool output can hold
    frame-shaped bytes), not a record of its own. The cost of that rule: a
    corrupted length field in the last-but-one record, followed by one lone
    committed record, reads as torn. ``padded`` (a session log): "the very
    end of the file" is the end of its data, before an all-zero remainder.

    About one pass over the region whatever it holds (zeros, a garbled block): a candidate is an
    offset where a payload could begin (a non-empty map's first byte, found by ``re``), its CRC
    computed only when it could chain (a plausible frame follows) or end the data. Every offset
    with a CRC for every length that fitted was quadratic: minutes of listing for a few MB.

    A window of a larger file (``store/extent.py: Beyond``): ``last`` is where its data ends, relative
    to ``data`` (past its end when the window stops short of it), only candidates before ``stop`` are
    tried, and none longer than ``limit``.
    """
    total = len(data)
    inside_cut = torn_reason in ("short-payload", "short-header")
    if last is None:
        last = data_end(data) if padded else total
    matches = _MAP_START.finditer(data, start + FRAME.size) if stop is None else _MAP_START.finditer(data, start + FRAME.size, stop + FRAME.size)
    for found in matches:
        pos = found.start() - FRAME.size
        length, crc = FRAME.unpack_from(data, pos)
        end = pos + FRAME.size + length
        if not 0 < length <= limit or end > total:
            continue
        alone = end >= last and not inside_cut  # may be accepted without a successor
        if not alone and not _may_start(data, end):
            continue  # it could not chain: no CRC of it
        if zlib.crc32(data[pos + FRAME.size : end]) == crc:
            status, payload, _ = _frame_at(data, pos)
            if status == "ok" and payload["seq"] >= expected_seq and predicate(payload):
                count, _ = _chain(data, pos, payload["seq"])
                if count >= 2 or (count == 1 and alone):
                    return pos
    return None


# the first byte of a record's payload: a non-empty msgpack map (fixmap of 1-15 entries, map 16, map 32)
_MAP_START = re.compile(rb"[\x81-\x8f\xde\xdf]")


def _may_start(data: bytes | memoryview, pos: int) -> bool:
    """Whether a record could start at ``pos``: a header whose length fits in ``data``, then a map's first byte.
    ``find_committed``'s cheap test of a candidate's successor, made before the CRC of the candidate."""
    if len(data) - pos <= FRAME.size:
        return False
    length = FRAME.unpack_from(data, pos)[0]
    return 0 < length <= MAX_RECORD_BYTES and pos + FRAME.size + length <= len(data) and _MAP_START.match(data, pos + FRAME.size) is not None


class Windowed(Protocol):
    """The data of a file past a bounded read of it (``store/extent.py: Beyond``; offsets relative to the read's start):
    where it ends, and ``find_committed`` of it a window at a time. A protocol: ``extent`` imports this module."""

    @property
    def last(self) -> int: ...

    def find_committed(self, start: int, expected_seq: int, predicate: Callable[[dict[str, Any]], bool], *,
                       torn_reason: str) -> int | None: ...


def torn_tail(
    data: bytes | memoryview,
    damage: Damage,
    expected_seq: int,
    *,
    commits: Callable[[dict[str, Any]], bool] | None = None,
    padded: bool = False,
    committed_end: int = 0,
    beyond: Windowed | None = None,
) -> bool:
    """Whether ``damage`` (``scan``'s, where the valid prefix of ``data`` ends) is a torn tail, which
    cutting loses nothing of, rather than damage to committed bytes (FORMAT.md §3.3): one rule for a
    session log and a mailbox.

    A write that never returned leaves a prefix of its bytes after the valid prefix, then what was
    there before: the zero padding, or the file's end. So the damage is *not* a torn tail when the
    bytes show a commit point in it:

    * it starts before ``committed_end``, an offset the caller knows committed records reach (a
      writer's checkpoint: bytes it read or wrote whole);
    * a committed frame that chains follows it (``find_committed`` with ``commits``);
    * every record is a commit point (``commits`` is ``None``: a mailbox, whose acceptances are
      acknowledged one record per write) and the damaged frame is not the cut-short last frame of a
      write (``short-header``, ``short-payload``): a frame whose announced bytes lie inside the
      data was written whole, and a whole frame that fails is a committed record changed since.

    A log's commit points are its ``turn/end`` records: a frame of a turn that never ended was
    promised to nobody, so only a ``turn/end`` that chains after the damage makes it corruption.

    ``beyond`` (``store/extent.py: read_records``): ``data`` is a bounded read of a padded file that
    stops at the damaged frame while more data follows (a stray byte far past the records), and the
    same rule is applied to the file, not to ``data``. A frame ``data`` holds only the header of (its
    length is over the store's limit) reads short there, but its announced bytes end before the
    file's data does: it was written whole (the third point), as a read of the whole region said.
    The committed frame is looked for in the file, a window at a time (``Beyond.find_committed``).
    """
    if damage.offset < committed_end:
        return False
    if commits is None and damage.reason not in ("short-header", "short-payload"):
        return False
    if beyond is not None:
        if commits is None and len(data) - damage.offset >= FRAME.size:
            length = FRAME.unpack_from(data, damage.offset)[0]
            if damage.offset + FRAME.size + length <= beyond.last:
                return False  # not cut short: its bytes lie inside the data
        found = beyond.find_committed(damage.offset + 1, expected_seq, commits or _every_record, torn_reason=damage.reason)
        return found is None
    committed = find_committed(data, damage.offset + 1, expected_seq, commits or _every_record, torn_reason=damage.reason,
                               padded=padded)
    return committed is None


def _every_record(_payload: dict[str, Any]) -> bool:
    return True


def scan_suffix(data: bytes | memoryview, *, check: Check | None = None) -> tuple[list[dict[str, Any]], bool]:
    """The records of the last bytes of a file of independent records (the roots index), read from its end,
    and whether anything after the first chained frame did not read (damage stepped over, a record that
    fails ``check``, or an end that is no record: a torn tail or a damaged last record, which only the
    whole file tells apart). A reader that must not lose a record to damage reads the whole file then.

    ``data`` may begin inside a record: reading starts at the first frame that
    chains (``find_committed``), then goes on as ``scan_all`` does, skipping a
    record that fails ``check``. What lies before that first chained frame is
    the caller's to read with a larger suffix.
    """
    start = find_committed(data, 0, 0, lambda _payload: True, torn_reason="crc-mismatch")
    if start is None:
        return [], False
    records: list[dict[str, Any]] = []
    pos, total = start, len(data)
    expected = _frame_at(data, start)[1]["seq"]
    damaged = False
    while pos < total:
        status, value, nxt = _frame_at(data, pos)
        if status != "ok" or value["seq"] != expected:
            damaged = True
            found = find_committed(data, pos + 1, expected, lambda _payload: True, torn_reason=status)
            if found is None:
                break  # a torn tail
            pos, expected = found, _frame_at(data, found)[1]["seq"]
            continue
        if check is None or check(value) is None:
            records.append(value)
        else:
            damaged = True
        expected += 1
        pos = nxt
    return records, damaged
