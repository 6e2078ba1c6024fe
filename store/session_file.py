"""One session, one file (format version 2): its lock, its lease, its header and its log.

``sessions/<id>`` is a single file (FORMAT.md §1, §4, §7)::

    0    magic  b"SAS2"
    4    data_start  u32le: where the log begins
    8    lease slot 0  (256 bytes: a framed lease record, or zeros)
    264  lease slot 1  (256 bytes)
    520  header: one framed msgpack map
    data_start  log records (FORMAT.md §3), seq 0 first
    ...         zeros to the next 4 KiB boundary (padding, FORMAT.md §3.4)

A child costs one inode: the lock is an ``flock`` on this file, the lease is
rewritten in place (``pwrite`` into one of two CRC'd slots, so a torn write
leaves the other), the header is written once with the file, and the log is
appended after it. Log offsets everywhere else in the store (projections,
the identity cache, tails) are offsets into the log region, i.e. relative to
``data_start``; only this module adds it.

**Padding.** Every write of the log region (creation included) is followed
by zeros up to the next ``BLOCK`` boundary of the file, so the appends after
it overwrite bytes in place: the file's size changes once per block, not at
every append, and an ``fsync`` then writes the data block alone, not also
the inode's new size. The log's end is therefore not the file's size:
``log_ends_at`` is the test (one ``pread``).

**Lease slots.** Each holds ``{gen, owner, epoch, state, acquired_at,
synced?}``; readers take the valid slot with the highest ``gen``. A writer
always writes the slot that does *not* hold the newest ``synced`` record (an
acquisition, fsync'd), so the newest durable epoch is never overwritten by a
write that may tear or be lost: after a crash the epoch never goes back
below an acquisition that returned. Every file is created with a synced
record in slot 0 (the creator's lease, or ``NEVER_LEASED`` at epoch 0), so a
slot that does not decode beside a valid one is a write that tore (ignored:
the other slot holds the durable state), and no valid slot at all is damage.

Who calls it: ``store/log.py`` (the writer), ``store/lease.py``,
``store/reader.py``, ``store/session.py`` (creation), ``store/migrate.py``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
import zlib
from dataclasses import dataclass
from typing import Any

from .atomic import NOFOLLOW
from .errors import REFUSED, CorruptSessionError, ReadOnlyStoreError, SessionNotFoundError, UnavailableSessionError
from .extent import Beyond, read_records
from .framing import BLOCK, FRAME, MAX_RECORD_BYTES, encode_record, zeros_from
from .lease_record import Lease
from .locks import flock_within, names_file
from .records import lease_fields, unpack

__all__ = [
    "MAGIC", "SLOT_SIZE", "SLOTS_AT", "HEADER_AT", "LeaseSlots", "SessionFile", "encode_session", "decode_slots", "parse_preamble",
    "Preamble", "SessionLock", "BLOCK", "block_padding",
]

MAGIC = b"SAS2"
_START = struct.Struct("<I")
SLOT_SIZE = 256
SLOTS_AT = 8
HEADER_AT = SLOTS_AT + 2 * SLOT_SIZE  # 520
# what a reader takes in its first read: the preamble, the lease slots and any usual header
FIRST_READ = 4096
_EMPTY_SLOT = bytes(SLOT_SIZE)
_ZEROS = bytes(BLOCK)
# above any gen or epoch a store reaches: the next one (+1) must still pack as a msgpack integer
_COUNTER_LIMIT = 2**63


def _slot_bytes(payload: dict[str, Any]) -> bytes:
    frame = encode_record(payload, what="a lease")
    if len(frame) > SLOT_SIZE:  # owner ids are at most 64 characters: never on a valid owner
        raise ValueError(f"a lease record of {len(frame)} bytes does not fit a {SLOT_SIZE}-byte slot")
    return frame + bytes(SLOT_SIZE - len(frame))


def _lease_payload(lease: Lease, gen: int, synced: bool) -> dict[str, Any]:
    payload: dict[str, Any] = {"gen": gen, **lease.to_record()}
    if synced:
        payload["synced"] = True
    return payload


@dataclass(frozen=True)
class _Slot:
    lease: Lease
    gen: int
    synced: bool


def _decode_slot(raw: bytes) -> _Slot | str | None:
    """The slot's record; ``None`` for an empty slot; the problem as text for one that does not decode."""
    if raw == _EMPTY_SLOT or not raw.strip(b"\0"):
        return None
    if len(raw) < FRAME.size:
        return "short slot"
    length, crc = FRAME.unpack_from(raw)
    body = raw[FRAME.size : FRAME.size + length]
    if length > SLOT_SIZE - FRAME.size or len(body) != length:
        return "bad length"
    if zlib.crc32(body) != crc:
        return "crc mismatch"
    try:
        data = unpack(body)
    except ValueError as exc:
        return str(exc)
    if not isinstance(data, dict):
        return "not a map"
    gen = data.get("gen")
    if isinstance(gen, bool) or not isinstance(gen, int) or gen < 0:
        return "gen is not a non-negative integer"
    fields = lease_fields(data)
    if isinstance(fields, str):
        return fields
    owner, epoch, state, acquired_at = fields
    if gen >= _COUNTER_LIMIT or epoch >= _COUNTER_LIMIT:
        return "gen or epoch out of range"  # no write could continue it: the next one would not pack
    return _Slot(Lease(owner, epoch, state, acquired_at), gen, data.get("synced") is True)


@dataclass(frozen=True)
class LeaseSlots:
    """What the two lease slots say: the lease (``None``: never leased), and where the next write goes."""

    lease: Lease | None
    gen: int  # the newest valid slot's gen (-1: none)
    target: int  # the slot the next write goes to: never the one holding the newest synced record
    problem: str | None  # both slots hold bytes and neither decodes: damage, not a crash
    # one slot holds bytes that do not decode beside the one read: a write torn by a crash, or rot
    # in the slot of the newest acquisition. That acquisition returned, and its holder may still
    # run, one epoch above ``lease``; the two cannot be told apart, so acquisitions skip that epoch
    undecodable_beside: bool = False

    @property
    def epoch(self) -> int | None:
        """The epoch a writer must match: 0 without a lease, ``None`` when released (nobody may write)."""
        if self.lease is None:
            return 0
        return None if self.lease.state == "released" else self.lease.epoch


def decode_slots(raw: bytes) -> LeaseSlots:
    """The lease of the ``2 * SLOT_SIZE`` bytes at ``SLOTS_AT``."""
    slots = [_decode_slot(raw[i * SLOT_SIZE : (i + 1) * SLOT_SIZE]) for i in (0, 1)]
    valid = [(i, s) for i, s in enumerate(slots) if isinstance(s, _Slot)]
    if not valid:
        # every file is created with a synced record in slot 0 and no write ever tears the slot
        # holding the newest synced record: no valid slot at all is damage, never a crash. Two
        # empty slots are a file written without that record: never leased
        problems = [s for s in slots if isinstance(s, str)]
        return LeaseSlots(None, -1, 0, f"lease slots do not decode ({problems[0]})" if problems else None)
    newest_i, newest = max(valid, key=lambda pair: pair[1].gen)
    synced = [(i, s) for i, s in valid if s.synced]
    keep = max(synced, key=lambda pair: pair[1].gen)[0] if synced else newest_i
    lease = None if newest.lease.epoch == 0 else newest.lease  # epoch 0: the creation's "never leased"
    return LeaseSlots(lease, newest.gen, 1 - keep, None, any(isinstance(s, str) for s in slots))


@dataclass(frozen=True)
class Preamble:
    """The start of a session file: where its log begins, and its header map (unvalidated)."""

    data_start: int
    header: Any


def parse_preamble(blob: bytes) -> Preamble | str:
    """The preamble of a file's first bytes, or what is wrong with it (``"short"`` when more bytes are needed)."""
    if len(blob) < HEADER_AT + FRAME.size:
        return "short" if blob[: len(MAGIC)] == MAGIC[: len(blob)] else "not a session file of format 2"
    if blob[:4] != MAGIC:
        return "not a session file of format 2 (bad magic)"
    (data_start,) = _START.unpack_from(blob, 4)
    length, crc = FRAME.unpack_from(blob, HEADER_AT)
    if length > MAX_RECORD_BYTES or data_start != HEADER_AT + FRAME.size + length:
        return f"header length {length} does not match the log's start {data_start}"
    if len(blob) < data_start:
        return "short"
    body = blob[HEADER_AT + FRAME.size : data_start]
    if zlib.crc32(body) != crc:
        return "header crc mismatch"
    try:
        return Preamble(data_start, unpack(body))
    except ValueError as exc:
        return f"header is {exc}"


# slot 0 of a session created without a lease: a synced record of epoch 0, so that a slot that
# does not decode beside it (or beside an empty slot) can only be damage, never a first write
NEVER_LEASED = Lease("", 0, "released", 0.0)


def encode_session(header: dict[str, Any] | bytes, lease: Lease | None, log: bytes, *, limit: int = MAX_RECORD_BYTES) -> bytes:
    """The whole file of a new session: slot 0 holds ``lease`` (created already held) or
    ``NEVER_LEASED``, marked synced (it is written and fsync'd with the file). ``header`` is a map, or the msgpack bytes of one, framed
    as they are (``store/migrate.py`` keeps a version-1 header byte for byte). A map framing to more
    than ``limit`` bytes is ``RecordTooLargeError``: creators pass the store's ``max_record_bytes``, so
    a root's label obeys the limit a child's label obeys in its descriptor (a header is read by every listing)."""
    if isinstance(header, bytes):
        head = FRAME.pack(len(header), zlib.crc32(header)) + header
    else:
        head = encode_record(header, limit=limit, what="a session header")
    data_start = HEADER_AT + len(head)
    slot0 = _slot_bytes(_lease_payload(NEVER_LEASED if lease is None else lease, 0, True))
    return b"".join((MAGIC, _START.pack(data_start), slot0, _EMPTY_SLOT, head, log))


def block_padding(end: int) -> bytes:
    """The zeros from file offset ``end`` to the next ``BLOCK`` boundary (none when ``end`` is on one)."""
    return _ZEROS[: -end % BLOCK]


class SessionFile:
    """An open session file. Not thread-safe; the owner closes it.

    ``open`` reads the preamble once; afterwards every log offset is relative
    to its ``data_start``. ``lock``/``unlock`` are ``flock`` on this
    descriptor: the session's one lock (FORMAT.md §7). ``record_limit`` is
    the store's largest record: how far past the records (or the log's last
    non-zero byte) a reader may have to read (``read_records``).
    """

    def __init__(self, session_id: str, path: str, fd: int, preamble: Preamble, *, record_limit: int = MAX_RECORD_BYTES) -> None:
        self.session_id = session_id
        self.path = path
        self.fd = fd
        self.record_limit = record_limit
        self.data_start = preamble.data_start
        self.header_map = preamble.header
        self._slots_raw = b""  # the slots last read, and what they said (``read_slots``)
        self._slots: LeaseSlots | None = None

    @classmethod
    def open(cls, session_id: str, path: str, *, write: bool = False, record_limit: int = MAX_RECORD_BYTES) -> "SessionFile":
        """``SessionNotFoundError`` without the file, ``UnavailableSessionError`` when it cannot be
        read (a link, a folder, a FIFO in its place), ``CorruptSessionError`` for a bad preamble."""
        flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_NONBLOCK | NOFOLLOW
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            raise SessionNotFoundError(session_id) from None
        except OSError as exc:
            if write and exc.errno in REFUSED and os.access(path, os.R_OK, follow_symlinks=False):
                raise ReadOnlyStoreError.cannot_write(session_id, f"sessions/{session_id}", exc) from None  # another user's, a read-only mount
            if exc.errno == errno.ELOOP:
                raise UnavailableSessionError(session_id, "it is a symbolic link (refused: nothing is read or written through it)") from None
            raise UnavailableSessionError.of(session_id, "its file cannot be opened", exc) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UnavailableSessionError(session_id, "its file is not a regular file")
            try:
                blob = os.pread(fd, FIRST_READ, 0)
                found = parse_preamble(blob)
                if found == "short" and len(blob) == FIRST_READ:  # a header longer than that: read it whole, not the log
                    blob = os.pread(fd, _START.unpack_from(blob, 4)[0], 0)
                    found = parse_preamble(blob)
            except OSError as exc:
                raise UnavailableSessionError.of(session_id, "its file cannot be read", exc) from None
            if isinstance(found, str):
                raise CorruptSessionError(session_id, "its file is truncated" if found == "short" else found)
            # a session's file copied or moved under another id's name (a header of another
            # version is left to ``reader.header_of``, which refuses it as unsupported first)
            header = found.header if isinstance(found.header, dict) else {}
            named = header.get("id")
            if header.get("version") == 1 and isinstance(named, str) and named != session_id:
                raise CorruptSessionError(session_id, f"its header names session {named!r}")
        except BaseException:
            os.close(fd)
            raise
        return cls(session_id, path, fd, found, record_limit=record_limit)

    # -- the lock --------------------------------------------------------------

    def lock(self, *, bounded: bool = False) -> None:
        """``bounded``: polled under ``LOCK_TIMEOUT_S``, then ``LockTimeoutError`` (a reader's second look,
        which must not wait forever for a stuck holder); else blocking in the kernel (the writers' hot path)."""
        if bounded:
            flock_within(self.fd, self.path)
        else:
            fcntl.flock(self.fd, fcntl.LOCK_EX)

    def unlock(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def still_linked(self) -> bool:
        """Whether ``sessions/<id>`` still names this file (``gc`` renames it away under the lock)."""
        return names_file(self.path, self.fd)

    # -- the lease -------------------------------------------------------------

    def read_slots(self) -> LeaseSlots:
        """The lease slots as they are now: one ``pread``, decoded again only when their bytes
        changed since the last read (a writer checks them under the lock at every append)."""
        raw = os.pread(self.fd, 2 * SLOT_SIZE, SLOTS_AT)
        if raw != self._slots_raw or self._slots is None:
            self._slots_raw, self._slots = raw, decode_slots(raw)
        return self._slots

    def write_lease(self, slots: LeaseSlots, lease: Lease, *, synced: bool) -> None:
        """Write ``lease`` into the slot ``slots`` (read under the caller's lock) names; fsync only
        when ``synced`` and the caller's policy says so (the caller's ``sync``)."""
        blob = _slot_bytes(_lease_payload(lease, slots.gen + 1, synced))
        written = os.pwrite(self.fd, blob, SLOTS_AT + slots.target * SLOT_SIZE)
        if written != len(blob):
            raise OSError(errno.EIO, f"short write of a lease slot ({written} of {len(blob)} bytes)")

    # -- the log region ----------------------------------------------------------

    def log_size(self) -> int:
        """The bytes of the log region, its zero padding included (``log_ends_at`` tells where its data ends)."""
        return max(0, os.fstat(self.fd).st_size - self.data_start)

    def log_ends_at(self, end: int) -> bool:
        """Whether the log holds ``end`` bytes and nothing but zero padding (or nothing) after them.

        One ``pread``: the byte before ``end`` (it exists unless the file was cut
        shorter) and the frame header at ``end``, which a record written there
        makes non-zero (its length is never 0). How a writer learns, under the
        session lock, that no other writer appended since its last write.
        """
        raw = os.pread(self.fd, 1 + FRAME.size, self.data_start + end - 1)
        return len(raw) >= 1 and zeros_from(raw, 1)

    def read_log(self, offset: int = 0, length: int | None = None) -> bytes:
        """``length`` bytes of the log from ``offset``; without ``length``, what ``read_records`` reads."""
        if length is None:
            return self.read_records(offset)[0]
        return os.pread(self.fd, length, self.data_start + offset)

    def read_records(self, offset: int = 0) -> tuple[bytes, Beyond | None]:
        """The log from ``offset`` (a record boundary) in bounded memory (``store/extent.py: read_records``):
        its records and what a scan needs to name their end, and ``Beyond`` (offsets relative to
        ``offset``) when more data lies past them, as far as the file's last non-zero byte. Every reader of
        the log to its end reads it so: a stray byte far past the records (a sparse GiB) costs no more
        than the records."""
        return read_records(self.fd, self.data_start + offset, self.record_limit)

    def write_log(self, blob: bytes, offset: int) -> bool:
        """Write ``blob`` at log ``offset``, followed by zeros to the next ``BLOCK`` boundary, in one
        ``pwrite``; whether it was written whole (a short write is a failed one, as without padding)."""
        at = self.data_start + offset
        whole = blob + block_padding(at + len(blob))
        return os.pwrite(self.fd, whole, at) == len(whole)

    def truncate_log(self, end: int) -> None:
        os.ftruncate(self.fd, self.data_start + end)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "SessionFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SessionLock:
    """A session's lock alone: an ``flock`` on its file, for appends to its companion files.

    ``acquire`` checks, once the lock is held, that ``sessions/<id>`` still names
    the locked file: a session ``gc`` collected while we waited is
    ``SessionNotFoundError``, and nothing is appended beside a session that is gone.
    """

    def __init__(self, session_id: str, path: str, *, timeout: float | None = None) -> None:
        """``timeout``: every ``acquire`` is bounded by it (as ``acquire(timeout=...)``); ``None``: as ``acquire``."""
        self.session_id = session_id
        self.path = path
        self._timeout = timeout
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
        except FileNotFoundError:
            raise SessionNotFoundError(session_id) from None
        except OSError as exc:
            raise UnavailableSessionError.of(session_id, "its file cannot be opened", exc) from None
        try:
            self._ino = os.fstat(self._fd).st_ino  # the locked file's, checked against its path at each acquire
        except BaseException:
            os.close(self._fd)
            raise

    def acquire(self, *, bounded: bool = False, timeout: float | None = None) -> None:
        """``bounded``: as ``SessionFile.lock``. ``timeout``: bounded by it, in seconds, rather than by
        ``LOCK_TIMEOUT_S`` (an acceptance bounded by its caller's deadline: ``LockTimeoutError`` once it
        passes, with nothing written)."""
        timeout = self._timeout if timeout is None else timeout
        if bounded or timeout is not None:
            flock_within(self._fd, self.path, timeout)
        else:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        if not names_file(self.path, self._fd, self._ino):
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            raise SessionNotFoundError(self.session_id)

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "SessionLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
