"""The write side of a session log: fenced appends, commit points, crash repair.

The log is the region of the session's file after its header
(``store/session_file.py``); every offset here is relative to its start.

``LogWriter.open`` is the resume path and the only code that repairs a log:
under the session lock it checks the writer's epoch against the lease,
restores the projection (from the ``identity`` cache when it is verifiably
current, by a full fold otherwise), refuses a corrupt log, truncates a torn
tail and appends the crash closers of an open turn — exactly once, since the
closers balance the turn. ``LogWriter.attach`` skips all of that for a log
whose projection the caller already has (its creator's, handed to the worker
with the turn): it reads only the file's preamble, and its first append
proves the epoch and the log's length like any append does.

Each ``append`` takes the session ``flock`` (held only for the write), reads
the lease slots (one ``pread``), refuses with ``FencedError`` on mismatch,
picks up records another same-epoch writer appended (one ``pread`` at the
log's end: only zeros there means nobody did), writes the whole batch with
one ``pwrite`` at the log's end, followed by zeros to the next 4 KiB of the
file (FORMAT.md §3.4: the appends after it overwrite them in place, so their
fsync does not also write a new file size), and, if that fails, cuts the
file back to its previous length. The ``strict`` fsync
runs after the lock is released (group commit, FORMAT.md §11). A failed write
or fsync marks the writer broken: it never writes again.

Not guaranteed: a writer resumed from the cache trusts the bytes before the
cached checkpoint (they were fsynced when the cache was written); damage
there is found by ``inspect`` / ``subagents store fsck``, not by resume.
"""

from __future__ import annotations

import errno
import logging
import time
from typing import Any, Callable, Sequence


from .errors import NO_ROOM, CorruptSessionError, DurabilityError, FencedError, NoRoomError, SubagentError, UnavailableSessionError, UnsupportedFormatError
from .committed import committed_end
from .events import EVENT_TYPES, closers
from .extent import Beyond
from .framing import Damage, RecordEncoder
from .header import SessionHeader
from .projection import Projection, read_cache, write_cache
from .reader import committed_damage, header_of, lost_damage, open_session, scan_events, scan_log
from .root import Store
from .session_file import LeaseSlots, SessionFile

__all__ = ["SeqMismatchError", "LogWriter", "ReleaseWriter", "load_projection", "read_projection"]

log = logging.getLogger(__name__)


# A commit point leaves the identity cache alone until the log has grown this far past it
# (unless identity or turn count changed): the most a reader folds after the cache. A log
# shorter than this has no cache at all (readers fold it whole): most children never pay
# the cache's inode.
CACHE_LAG_BYTES = 64 * 1024


ReleaseWriter = Callable[..., None]  # ``store.lease.write_released``: the released lease and its catalog row


class SeqMismatchError(SubagentError, ValueError):
    """Raised when a batch's first seq is not the log's next seq; nothing is written."""

    code = "SEQ_MISMATCH"


def _read_cache(store: Store, session_id: str) -> Projection | None:
    try:
        return read_cache(store.path(session_id, "identity"))
    except OSError:  # an unreadable cache is only a cache: fold the log instead
        return None


def _from_cache(store: Store, session_id: str, header: SessionHeader, file: SessionFile, size: int) -> tuple[Projection, bytes, int, Beyond | None] | None:
    """The cached projection if the record it ends on is still on disk, plus the log after it (``SessionFile.read_records``)."""
    if size < CACHE_LAG_BYTES:
        return None  # no cache is written for a log this short (padding counted: never skipped wrongly)
    cached = _read_cache(store, session_id)
    if cached is None or cached.seq < 0 or cached.end_offset > size or cached.seed_length != (header.seed_length or 0):
        return None
    anchor = file.read_log(cached.last_offset, cached.end_offset - cached.last_offset)
    check = scan_events(anchor, start_seq=cached.seq)
    if check.damage is not None or len(check.records) != 1 or check.end != len(anchor):  # not padding after it either
        return None
    rest, beyond = file.read_records(cached.end_offset)
    return cached, rest, cached.end_offset, beyond


def _lost_from(store: Store, header: SessionHeader, file: SessionFile, end: int) -> int | None:
    """Where the parent's index says this log's records reach, when that is past ``end``: records
    were lost behind the store's back (``store/committed.py``). None: nothing says so."""
    committed = committed_end(store, header, file)
    return committed if committed is not None and end < committed else None


def _fold(store: Store, session_id: str, header: SessionHeader, file: SessionFile, use_cache: bool) -> tuple[Projection, int, str, Damage | None]:
    found = _from_cache(store, session_id, header, file, file.log_size()) if use_cache else None  # its size: padding included
    if found is None:
        projection = Projection(seed_length=header.seed_length or 0)
        (rest, beyond), base = file.read_records(0), 0  # bounded: not to a stray byte far past the records
    else:
        projection, rest, base, beyond = found
    events, offsets, end, damage, status = scan_log(session_id, rest, start_seq=projection.next_seq, base_offset=base,
                                                    root=header.parent_session is None, beyond=beyond)
    if status == "corrupt":
        assert damage is not None
        raise committed_damage(session_id, damage)
    projection.fold(events, offsets, end)
    if not events and found is None:
        projection.end_offset = end
    return projection, end, status, damage


def load_projection(
    store: Store, session_id: str, header: SessionHeader, file: SessionFile, *, use_cache: bool = True, verify_committed: bool = False,
) -> tuple[Projection, int, str]:
    """Projection of the valid log, the byte end of the valid prefix, and its status.

    Raises ``CorruptSessionError`` for committed damage (see ``store/reader.py``), and for a torn tail
    before the end its parent's index says its records reach (``store/committed.py``): that tail is
    a committed record changed in place or cut short, not a crash mid-append. Only a torn log pays
    for that look (one read of the parent's index), unless ``verify_committed``: then a log that reads
    clean is compared too, which is what a resume needs (a whole last turn zeroed, or a log cut at the
    record boundary before its ``turn/end``, reads clean). A log read without the session lock while a
    resumption settled again may be older than the row, so it is read once more, after the row.
    """
    projection, end, status, damage = _fold(store, session_id, header, file, use_cache)
    committed = _lost_from(store, header, file, end) if status == "torn" or verify_committed else None
    if committed is not None:
        projection, end, status, damage = _fold(store, session_id, header, file, use_cache)
        if end < committed:
            raise committed_damage(session_id, lost_damage(end, committed, damage if status == "torn" else None))
    return projection, end, status


def read_projection(store: Store, session_id: str, *, verify_committed: bool = False) -> Projection:
    """The current projection of a session, read-only (the cache is verified, never trusted blindly).

    Unlike the catalog's identity read, this folds every record after the
    cached checkpoint, so counts that change mid-turn (consumed messages) are
    exact even when the last turn never committed. ``verify_committed``: see ``load_projection``.
    """
    with open_session(store, session_id) as file:
        header = header_of(file)
        try:
            projection, _end, _status = load_projection(store, session_id, header, file, verify_committed=verify_committed)
        except OSError as exc:
            raise UnavailableSessionError.of(session_id, "its log cannot be read", exc) from None
        return projection


class LogWriter:
    """An open, fenced writer of one session log. Not thread-safe; one per activation."""

    def __init__(
        self, store: Store, session_id: str, *, epoch: int, projection: Projection, file: SessionFile,
        header: SessionHeader | None = None,
    ) -> None:
        self.store = store
        self.header = header  # None for a writer attached without validating the header (``attach``)
        self.session_id = session_id
        self.epoch = epoch
        self.projection = projection
        self._file = file
        self._fd = file.fd
        self._encode = RecordEncoder(store.max_record_bytes)
        self._what = f"log of {session_id}"
        self._broken: BaseException | None = None
        self._cache_mark: tuple[int | None, int, int] | None = None  # what the identity cache last got
        self.repaired: list[dict[str, Any]] = []
        self.closed_turn: int | None = None  # the seq of the ``turn/start`` whose open turn ``open`` closed

    # -- opening (the resume path) -------------------------------------------

    @classmethod
    def open(cls, store: Store, session_id: str, *, epoch: int, repair: bool = True, cause: str | None = None,
             crash: str | None = None) -> "LogWriter":
        """The resume path: a fenced writer, the log repaired first (a torn tail cut, an open turn closed).

        ``cause`` goes on the ``turn/end`` of a turn the repair closes: why its
        worker died, when the caller knows it was being stopped; ``crash``: how it died (store/events.py ``closers``).
        """
        file = open_session(store, session_id, write=True)
        try:
            header = header_of(file)
            file.lock()
            try:
                writer = cls(store, session_id, epoch=epoch, projection=Projection(), file=file, header=header)
                writer._check_fence()
                projection, end, status = load_projection(store, session_id, header, file)
                writer.projection = projection
                if repair:
                    if status == "torn":
                        writer._truncate(end)
                    fix = closers(projection.open_turn, projection.open_step, projection.open_calls, cause=cause, crash=crash)
                    if fix and status != "torn":
                        # an open turn in a log that ends clean: a crash between appends, or the turn's
                        # ``turn/end`` zeroed behind the store's back (it reads like padding)
                        committed = _lost_from(store, header, file, end)
                        if committed is not None:
                            raise committed_damage(session_id, lost_damage(end, committed, None))
                    if fix:
                        writer.closed_turn = projection.open_turn  # the append below folds the closers into it
                        writer.repaired = writer._append_locked(fix)
                    if status == "torn" or fix:
                        writer._commit_locked()
            finally:
                file.unlock()
            return writer
        except BaseException:
            file.close()
            raise

    @classmethod
    def attach(
        cls, store: Store, session_id: str, *, epoch: int, projection: Projection, header: SessionHeader | None = None,
    ) -> "LogWriter":
        """A writer of a log whose valid prefix ``projection`` describes, opened without reading it.

        For a session's first turn, right after its creation by the same
        supervisor, which folded the records it wrote: only the file's preamble
        is read at open (no identity cache, log bytes or lock), and nothing is repaired (a
        log its creator just wrote whole and fsynced has no torn tail and no
        open turn). Nothing is trusted either: the first append takes the lock,
        checks the epoch against the lease (``FencedError`` after a takeover)
        and the log's length against ``projection.end_offset`` (a same-epoch
        record after it is folded in; a shorter log is ``CorruptSessionError``).
        """
        writer = cls(store, session_id, epoch=epoch, projection=projection, file=open_session(store, session_id, write=True), header=header)
        # as if the cache were current: a log this new is shorter than CACHE_LAG_BYTES (no cache)
        writer._cache_mark = (projection.identity_seq, projection.turns, projection.end_offset)
        return writer

    # -- fencing ---------------------------------------------------------------

    def _check_fence(self) -> LeaseSlots:
        """The lease slots, once they show the lease epoch writers must match is ours; ``FencedError`` if not.

        Called under the session lock: one ``pread`` of the two lease slots,
        decoded again only when their bytes changed (``SessionFile.read_slots``).
        The epoch is 0 when never leased, and none matches a released lease,
        damaged slots or slots that cannot be read.
        """
        try:
            slots = self._file.read_slots()
        except OSError as exc:
            raise FencedError(self.session_id, epoch=self.epoch, current_epoch=None, lease=f"unreadable ({exc.strerror})") from None
        current = None if slots.problem is not None else slots.epoch
        if current != self.epoch:
            if slots.problem is not None:
                shown = "slots that do not read"
            elif current is None and slots.lease is not None:
                shown = f"epoch {slots.lease.epoch}, released"
            else:
                shown = None
            raise FencedError(self.session_id, epoch=self.epoch, current_epoch=current, lease=shown)
        return slots

    # -- appending ---------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        return self.projection.next_seq

    def append(self, batch: Sequence[tuple[str, Any]], *, first_seq: int | None = None, commit: bool = False) -> list[dict[str, Any]]:
        """Append ``(type, data)`` events as one write; returns the records written.

        ``first_seq``, when given, must equal the log's next seq or nothing is
        written (``SeqMismatchError``). ``commit`` makes it a commit point.
        This is the hot path of every turn: one lock, one ``pread`` of the
        lease slots, one ``pread`` at the log's end, one ``pwrite``. The lock covers
        the fence check and the write, which fix the record's place; the fsync
        (``strict``) runs after it is released, so a writer waiting for the lock
        does not also wait for our fsync, and two writers' fsyncs can share one
        journal commit (group commit). ``append`` still returns only after its
        own fsync, and a later record can never be durable without it (an
        ``fsync`` covers the whole file), so a crash still leaves a prefix.
        """
        if self._broken is not None:
            raise DurabilityError(f'writer of session "{self.session_id}" is broken: {self._broken}') from self._broken
        for kind, _ in batch:
            if kind not in EVENT_TYPES:
                # readers refuse unknown types: a writer must never make a log they cannot read
                raise UnsupportedFormatError(f'event type "{kind}" is not one this store writes', event_type=kind)
        file = self._file
        file.lock()
        try:
            self._check_fence()
            if not file.log_ends_at(self.projection.end_offset):
                self._sync_tail()
            if first_seq is not None and first_seq != self.next_seq:
                raise SeqMismatchError(
                    f'append seq mismatch for "{self.session_id}": expected {self.next_seq}, got {first_seq}',
                    session_id=self.session_id,
                )
            records, chunks = self._write_locked(batch)
        finally:
            file.unlock()
        self._settle(records, chunks, locked=False)
        if commit:
            self.commit()
        return records

    def _sync_tail(self) -> None:
        """Fold records another writer of the same epoch appended since our last write (into the padding or after it)."""
        end = self.projection.end_offset
        size = self._file.log_size()
        if size < end:
            raise CorruptSessionError(self.session_id, f"log shrank under its writer ({size} < {end} bytes)")
        data, beyond = self._file.read_records(end)
        result = scan_events(data, start_seq=self.next_seq, base_offset=end, beyond=beyond)
        if result.damage is not None:
            raise CorruptSessionError(self.session_id, f"another writer left {result.damage.reason} at byte {result.damage.offset}")
        self.projection.fold(result.records, result.offsets, result.end)

    def _append_locked(self, batch: Sequence[tuple[str, Any]]) -> list[dict[str, Any]]:
        records, chunks = self._write_locked(batch)
        self._settle(records, chunks, locked=True)
        return records

    def _write_locked(self, batch: Sequence[tuple[str, Any]]) -> tuple[list[dict[str, Any]], list[bytes]]:
        """Frame and write the batch at the tail; a failed write cuts the file back and breaks the writer."""
        now = time.time()
        seq = self.next_seq
        epoch = self.epoch
        encode = self._encode
        records: list[dict[str, Any]] = []
        chunks: list[bytes] = []
        for kind, data in batch:
            record = {"seq": seq, "ts": now, "type": kind, "data": data, "epoch": epoch}
            records.append(record)
            chunks.append(encode(record))  # RecordTooLargeError before any write
            seq += 1
        blob = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        try:
            if not self._file.write_log(blob, self.projection.end_offset):
                raise OSError(errno.ENOSPC, f"short write of {len(blob)} bytes (the disk is full, or the file at its size limit)")
        except OSError as exc:
            # out of space, the log cut back to where it was: whole, and the writer goes on (a turn
            # can still close with the error, in the block the log already has); any other failure
            # leaves the file's state unknown, and breaks it
            message = f'append to session "{self.session_id}" failed: {exc}'
            if not (self._cut_back(self.projection.end_offset) and exc.errno in NO_ROOM):
                self._broken = exc
                raise DurabilityError(message, session_id=self.session_id) from exc
            raise NoRoomError(message, session_id=self.session_id) from exc
        return records, chunks

    def _settle(self, records: list[dict[str, Any]], chunks: list[bytes], *, locked: bool) -> None:
        """Sync the written batch as the policy says, then fold it into the projection.

        A failed fsync is never retried and breaks the writer. The batch is cut
        back off the file when nothing follows it; when another same-epoch
        writer has appended behind it in the meantime it stays (cutting it would
        cut theirs) — like any append that did not return, it may or may not
        survive a crash.
        """
        start = self.projection.end_offset
        try:
            self.store.durability.after_append(self._fd, self._what)
        except DurabilityError as exc:
            self._broken = exc
            if locked:
                self._cut_back(start)
            else:
                self._file.lock()
                try:
                    if self._file.log_ends_at(start + sum(map(len, chunks))):
                        self._cut_back(start)
                finally:
                    self._file.unlock()
            raise
        apply = self.projection.apply
        offset = start
        for record, chunk in zip(records, chunks):
            stop = offset + len(chunk)
            apply(record, offset, stop)
            offset = stop

    def _cut_back(self, length: int) -> bool:
        """Cut the log back to ``length`` bytes; whether that worked (else the torn tail is repaired on the next open)."""
        try:
            self._file.truncate_log(length)
        except OSError:
            return False
        return True

    def _truncate(self, end: int) -> None:
        try:
            self._file.truncate_log(end)
        except OSError as exc:
            raise DurabilityError(f'truncating the torn tail of "{self.session_id}" failed: {exc}') from exc
        self.projection.end_offset = end

    # -- commit points -------------------------------------------------------------

    def commit(self) -> None:
        """A commit point: fsync under ``batched`` and refresh the identity cache when readers need it.

        The fsync needs no lock (it covers whatever is in the file); only the
        cache rewrite takes it, and checks the fence first like any append: a
        writer frozen between its last append and this commit, then taken
        over, must not overwrite the new owner's cache with its older
        checkpoint (``FencedError``, nothing written).
        """
        self._sync_at_commit()
        if self._cache_due():
            self._file.lock()
            try:
                self._check_fence()
                self._refresh_cache()
            finally:
                self._file.unlock()

    def _commit_locked(self) -> None:
        self._sync_at_commit()
        if self._cache_due():
            self._refresh_cache()

    def _sync_at_commit(self) -> None:
        if self._broken is not None:
            raise DurabilityError(f'writer of session "{self.session_id}" is broken: {self._broken}') from self._broken
        try:
            self.store.durability.at_commit(self._fd, self._what)
        except DurabilityError as exc:
            self._broken = exc
            raise

    def _cache_due(self) -> bool:
        """Whether a reader would miss something the identity cache does not have.

        The catalog takes a session's identity from the cache alone, so a new
        descriptor always makes it due; so does a finished turn (listings show
        turn counts and timing). Other commit points (a message accepted mid-
        turn, a benchmark's group commit) leave it until the log has grown
        ``CACHE_LAG_BYTES`` past it: readers fold the suffix after the cached
        checkpoint, and that bound keeps the fold short. Skipping the rewrite
        spares a commit an open + pwrite + close and a second inode in the
        journal commit that the next fsync pays for (measured: ~50 µs + a
        slower fsync per commit in benchmarks/store_append.py).
        """
        projection = self.projection
        mark = self._cache_mark
        if projection.end_offset < CACHE_LAG_BYTES:
            return False  # a short log is folded whole by its readers: no cache file at all
        return (
            mark is None
            or mark[0] != projection.identity_seq
            or mark[1] != projection.turns
            or projection.end_offset - mark[2] >= CACHE_LAG_BYTES
        )

    def _refresh_cache(self) -> None:
        """Rewrite the identity cache. A cache that cannot be written (the disk is full) fails nothing:
        it is derived, and one left half written does not read (a framed, CRC'd record), so readers
        fold the log instead; the next commit point tries again."""
        projection = self.projection
        try:
            write_cache(self.store.path(self.session_id, "identity"), projection)
        except OSError as exc:
            log.warning("identity cache of %s not written: %s", self.session_id, exc, extra={"session": self.session_id})
            return
        self._cache_mark = (projection.identity_seq, projection.turns, projection.end_offset)

    def release_lease(self, owner_id: str, write_released: ReleaseWriter) -> None:
        """``store.lease.release_lease`` on what the writer holds, after its last commit point.

        Its lock and its open file: no lookup of the header, no new descriptor.
        ``write_released`` is ``store.lease.write_released`` (passed in: the
        lease module's catalog rows read logs through this one). Not durable,
        as any release (lost in a crash, it reads as the dead owner's lease).
        ``FencedError`` when the lease moved on (nothing written).
        """
        self._file.lock()
        try:
            slots = self._check_fence()
            lease = slots.lease
            if lease is None or lease.owner != owner_id:
                raise FencedError(self.session_id, epoch=self.epoch, current_epoch=None if lease is None else lease.epoch)
            # the catalog row comes from the writer's projection when that is the whole log
            whole = self._file.log_ends_at(self.projection.end_offset)
            write_released(self.store, self._file, slots, header=self.header, projection=self.projection if whole else None)
        finally:
            self._file.unlock()

    def close(self) -> None:
        if self._fd >= 0:
            self._file.close()
            self._fd = -1

    def __enter__(self) -> "LogWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
