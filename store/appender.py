"""Appending one record to a framed file that several processes append to.

Used by the mailbox and the control file under the caller's lock (the
session's), and by the children and roots indexes under the index file's own
lock (``store/index_file.py``). The caller's ``Store`` keeps a checkpoint per file (byte
offset and next seq after its last append): the next append scans only what
other processes added since, so an append costs O(1) in the file's length
instead of a full re-read. The checkpoint is a hint: if it no longer falls on
a record boundary the file is scanned from the start.

Every record is framed (and checked against the store's ``max_record_bytes``)
before any byte of the file changes, so an oversize record leaves no trace.

A ``padded`` file (the mailbox, FORMAT.md §8) is written like a session log:
the append that extends it pads it with zeros to the next 4 KiB boundary, and
the appends after it overwrite those zeros in place (``pwrite`` at the end of
the data, so its descriptor is not ``O_APPEND``): their fsync then writes no
size change. An all-zero remainder is the file's end, not damage.

For a file read as a prefix (the mailbox: ``skip_damage=False``), damage is
cut off only when it is provably a torn tail (``framing.torn_tail``, the rule
the session log uses, with every record a commit point: the cut-short last
frame of one append, then zeros or the file's end, starting at or after the
checkpoint); any other damage — a whole frame that fails, records after it,
damage before the checkpoint — is corruption: cutting would lose accepted
messages, so it raises ``CorruptSessionError`` and writes nothing. For a file
whose readers step over damage (control, children index:
``skip_damage=True``) the append goes on after the last record.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any, Callable, Protocol, Sequence

from .atomic import FILE_MODE, NOFOLLOW
from .checkpoints import AppendCheckpoints
from .errors import NO_ROOM, REFUSED, CorruptSessionError, NoRoomError, ReadOnlyStoreError, RecordTooLargeError, UnavailableSessionError, write_failed
from .extent import Beyond, read_records, skim_file
from .framing import FRAME, Check, encode_record, scan, torn_tail, zeros_from
from .record_size import payload_size
from .session_file import block_padding
from .root import Store

__all__ = [
    "Lock", "SelfLocked", "WIDEST_SEQ", "append_record", "append_records", "append_durably", "check_fits", "frame_record", "open_appendable",
]


class Lock(Protocol):
    """The caller's lock ``append_durably`` appends under: a session's (``SessionLock``)."""

    def acquire(self) -> None: ...

    def release(self) -> None: ...

    def close(self) -> None: ...


class SelfLocked(Protocol):
    """What ``append_durably`` appends through under the file's own lock: an index (``store/index_file.py``)."""

    @property
    def fd(self) -> int: ...

    @property
    def size(self) -> int: ...

    def acquire(self) -> None: ...

    def close(self) -> None: ...


def open_appendable(path: str, *, owner: str, key: str, in_place: bool = False) -> tuple[int, os.stat_result]:
    """Open (creating) a framed file to append to: its descriptor and ``fstat``. ``UnavailableSessionError``
    for a link, a loop, a folder or anything else that is not a regular file in its place, so nothing is
    ever appended through one; ``DurabilityError`` when the file system has no inode or room left to make it.
    ``in_place``: not ``O_APPEND`` (a padded file is written over its padding)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | NOFOLLOW | (0 if in_place else os.O_APPEND)
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError as exc:
        if exc.errno in NO_ROOM:  # the disk, not the session's files: nothing is in the way
            raise NoRoomError(f"{key} cannot be created ({exc.strerror or exc})", key=key) from exc
        if exc.errno in REFUSED:  # another user's file or folder, a read-only mount: a write refused
            raise ReadOnlyStoreError.cannot_write(owner, key, exc) from None
        raise UnavailableSessionError.of(owner, f"{key} cannot be opened", exc) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnavailableSessionError(owner, f"{key} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def append_record(fd: int, record: dict[str, Any], *, tails: AppendCheckpoints, key: str, owner: str, **how: Any) -> int:
    """Append ``record`` with the next contiguous ``seq``; returns that seq. The caller holds the lock."""
    return append_records(fd, [record], tails=tails, key=key, owner=owner, **how)


def append_records(
    fd: int, records: Sequence[dict[str, Any]], *, tails: AppendCheckpoints, key: str, owner: str,
    limit: int, check: Check | None = None, skip_damage: bool = False, too_large: str | None = None, size: int | None = None,
    padded: bool = False, refuse_damage: bool = False, committed: int = 0, unchanged: bool = False,
) -> int:
    """Append ``records`` with contiguous seqs in one ``write``; returns the first seq. The caller holds the lock
    (and may pass the file's ``size``, from an ``fstat`` it made under it). ``padded``: the file may end in zero
    padding and is written in place (its descriptor must not be ``O_APPEND``). ``refuse_damage``: any damage
    (a torn tail too) is ``CorruptSessionError`` and nothing is written, for a caller that rebuilds the
    file instead of cutting or stepping over what it cannot read (``index/roots``). ``committed``: an offset the
    caller knows committed records reach (a mailbox's end as its log consumed it): damage before it is no torn tail.
    ``unchanged``: the caller knows nobody wrote the file since the store's checkpoint of it was taken (a held
    mailbox writer whose watch saw no write since its own append left that checkpoint), so nothing follows the
    checkpoint but padding: no ``pread`` looks (a followup's acceptance makes one syscall fewer)."""
    if size is None:
        size = os.fstat(fd).st_size
    offset, next_seq = tails.get(key) or (0, 0)
    if offset > size:
        offset, next_seq = 0, 0  # the file was rebuilt under us
    committed_end = max(offset, committed)  # records reach this far: this process read or wrote them whole, or the caller knows
    # nobody appended since our checkpoint (the usual case for a mailbox): nothing, or only its padding, to read;
    # in a padded file, a zero frame header at the checkpoint says so (a record's length is never 0)
    nothing_new = offset == size or (unchanged and 0 < offset < size) or (padded and offset and zeros_from(os.pread(fd, FRAME.size, offset)))
    # read as a log is (``extent.read_records``): the records, not to a stray byte far past them
    data, beyond = (b"", None) if nothing_new else read_records(fd, offset, limit)
    result = scan(data, start_seq=next_seq, base_offset=offset, check=check, padded=padded, last=_last(beyond, padded))
    if result.damage is not None and offset:
        offset, next_seq = 0, 0  # our checkpoint is not a record boundary any more
        data, beyond = read_records(fd, 0, limit)
        result = scan(data, check=check, padded=padded, last=_last(beyond, padded))
    end, seq, cut = result.end, next_seq + len(result.records), False
    if result.damage is not None:
        if refuse_damage:
            raise CorruptSessionError(owner, f"{key}: {result.damage.reason} at byte {result.damage.offset}", offset=result.damage.offset)
        if skip_damage:
            skim = skim_file(fd, check=check)
            end, seq, cut = skim.end, skim.next_seq, skim.tail is not None
        elif not torn_tail(data, result.damage, seq, padded=padded, committed_end=committed_end, beyond=beyond):
            raise CorruptSessionError(owner, f"{key}: {result.damage.reason} at byte {result.damage.offset} is no torn tail "
                                      "(FORMAT.md §3.3): cutting it would drop accepted records", offset=result.damage.offset)
        else:
            cut = True
    blob = b"".join(frame_record({**record, "seq": seq + i}, limit, key, too_large) for i, record in enumerate(records))
    if cut:
        os.ftruncate(fd, end)  # a torn tail of an append that never returned
    if padded and end + len(blob) <= size and not cut:
        whole = blob  # over the padding
    elif padded:
        whole = blob + block_padding(end + len(blob))  # extends the file: new padding after it
    else:
        whole = blob
    try:
        written = os.pwrite(fd, whole, end) if padded else os.write(fd, whole)
        if written != len(whole):
            raise OSError(errno.ENOSPC, f"short write: {written} of {len(whole)} bytes (the disk is full, or the file at its size limit)")
    except OSError as exc:
        _cut_back(fd, end)
        raise write_failed(f"append to {key} failed: {exc}; nothing was appended", exc, key=key) from exc
    tails[key] = (end + len(blob), seq + len(records))
    return seq


def _last(beyond: Beyond | None, padded: bool) -> int | None:
    """``scan``'s ``last`` for a bounded read: where the data ends, for a padded file (zeros before it are no end)."""
    return beyond.last if beyond is not None and padded else None


def _cut_back(fd: int, end: int) -> None:
    """After a failed write: the file ends where the records it holds end, as before the append (a
    file may end without padding), so the part of a record the file system took is not read as a
    record, nor as damage that refuses every later append. Cutting needs no space; if even that
    fails the append still fails, and ``fsck`` reports what it left."""
    try:
        os.ftruncate(fd, end)
    except OSError:
        pass


# msgpack's widest integer (9 bytes): a record framed with it is at least as long as with its real seq
WIDEST_SEQ = 2**64 - 1


def frame_record(record: dict[str, Any], limit: int, key: str, too_large: str | None) -> bytes:
    """The framed record; a record above ``limit`` is ``RecordTooLargeError`` with the code ``too_large`` (when given)."""
    try:
        return encode_record(record, limit=limit, what=f"a record of {key}")
    except RecordTooLargeError as exc:
        if too_large is not None:
            exc.code = too_large  # type: ignore[misc]
        raise


def check_fits(record: dict[str, Any], limit: int, key: str, too_large: str | None, *, text_at: tuple[str, ...]) -> None:
    """What ``frame_record`` refuses, refused alike (the same error, code and words), without framing ``record``
    when its size can be reckoned: its long text, at ``text_at``, is sized, not encoded (``record_size.py``)."""
    size = payload_size(record, text_at)
    if size is None:  # text msgpack cannot encode: framing it says how, as before
        frame_record(record, limit, key, too_large)
    elif size > limit:
        exc = RecordTooLargeError(f"a record of {key}", size=size, limit=limit)
        if too_large is not None:
            exc.code = too_large  # type: ignore[misc]
        raise exc


def append_durably(
    store: Store, path: str, record: dict[str, Any] | Sequence[dict[str, Any]], *, key: str, owner: str, what: str,
    lock: Lock | None = None, index: SelfLocked | None = None, check: Check | None = None, skip_damage: bool = False, too_large: str | None = None,
    durable: bool = True, keep: Callable[[dict[str, Any]], bool] | None = None, refuse_damage: bool = False,
) -> int | None:
    """Under ``lock`` (the caller's, who closes it), or under ``index``'s own lock (an index file, which
    this closes: ``store/index_file.py``): append ``record`` (or a
    sequence of records, in one write) and make it durable under the store's policy (strict
    and batched both fsync before returning; ``durable=False``: never, for a record whose
    loss only costs a re-derivation). Returns the (first) record's seq.

    ``too_large`` is the error code of a record above the store's limit (default ``RECORD_TOO_LARGE``).
    ``keep`` is asked about each record under the lock, before anything is written; the records it
    refuses are not appended (``None`` when it refused them all): a check and its append in one
    critical section (``gc``'s tombstones are written only for a session that is still gone).
    ``refuse_damage``: as ``append_records``'s."""
    records = [record] if isinstance(record, dict) else list(record)
    for one in records:  # refused before the lock, the file or its tail are touched; the widest seq bounds the size
        frame_record({**one, "seq": WIDEST_SEQ}, store.max_record_bytes, key, too_large)
    if index is not None:
        try:
            index.acquire()
            try:
                seq = _append_held(store, index.fd, index.size, records, key=key, owner=owner, what=what, check=check,
                                   skip_damage=skip_damage, too_large=too_large, durable=False, keep=keep,
                                   refuse_damage=refuse_damage)
            finally:
                index.release()
            # the fsync after the lock, as a log's commit (FORMAT.md §11): the write fixed the records'
            # place, and other appenders (a worker's settled row, the next creation batch) need not
            # wait for this device flush; it covers every byte before them, so a crash still leaves a prefix
            if durable and seq is not None:
                store.durability.commit_append(index.fd, what)
            return seq
        finally:
            index.close()
    assert lock is not None, "append_durably needs the caller's lock or an index file"
    lock.acquire()
    try:
        fd, info = open_appendable(path, owner=owner, key=key)
        try:
            return _append_held(store, fd, info.st_size, records, key=key, owner=owner, what=what, check=check,
                                skip_damage=skip_damage, too_large=too_large, durable=durable, keep=keep,
                                refuse_damage=refuse_damage)
        finally:
            os.close(fd)
    finally:
        lock.release()


def _append_held(
    store: Store, fd: int, size: int, records: list[dict[str, Any]], *, key: str, owner: str, what: str, check: Check | None,
    skip_damage: bool, too_large: str | None, durable: bool, keep: Callable[[dict[str, Any]], bool] | None,
    refuse_damage: bool = False,
) -> int | None:
    """``append_durably``'s critical section: the file is open on ``fd`` and locked."""
    if keep is not None:
        records = [one for one in records if keep(one)]
        if not records:
            return None
    seq = append_records(fd, records, tails=store.index_tails, key=key, owner=owner, limit=store.max_record_bytes,
                         check=check, skip_damage=skip_damage, too_large=too_large, size=size, refuse_damage=refuse_damage)
    if durable:
        store.durability.commit_append(fd, what)
    return seq
