"""Appending one record to a framed file that several processes append to.

Used by the mailbox and the children index, under the caller's lock. The
caller's ``Store`` keeps a checkpoint per file (byte offset and next seq after
its last append): the next append scans only what other processes added
since, so an append costs O(1) in the file's length instead of a full
re-read. The checkpoint is a hint: if it no longer falls on a record
boundary the file is scanned from the start.

Damage at the end is a torn tail (an append that never returned) and is cut
off; damage followed by any valid record is corruption — accepted messages
would be lost by cutting it — and raises ``CorruptSessionError``.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from .errors import CorruptSessionError
from .framing import encode_record, find_later_record, scan
from .locks import SessionFlock
from .root import Store

__all__ = ["append_record", "append_records", "append_durably"]


def append_record(fd: int, record: dict[str, Any], *, tails: dict[str, tuple[int, int]], key: str, owner: str) -> int:
    """Append ``record`` with the next contiguous ``seq``; returns that seq. The caller holds the lock."""
    return append_records(fd, [record], tails=tails, key=key, owner=owner)


def append_records(fd: int, records: Sequence[dict[str, Any]], *, tails: dict[str, tuple[int, int]], key: str, owner: str) -> int:
    """Append ``records`` with contiguous seqs in one ``write``; returns the first seq. The caller holds the lock."""
    size = os.fstat(fd).st_size
    offset, next_seq = tails.get(key, (0, 0))
    if offset > size:
        offset, next_seq = 0, 0  # the file was rebuilt under us
    result = scan(os.pread(fd, size - offset, offset), start_seq=next_seq, base_offset=offset)
    if result.damage is not None and offset:
        offset, next_seq = 0, 0  # our checkpoint is not a record boundary any more
        result = scan(os.pread(fd, size, 0))
    if result.damage is not None:
        data = os.pread(fd, size, 0)
        if find_later_record(data, result.damage.offset + 1, lambda _payload: True) is not None:
            raise CorruptSessionError(owner, f"{key}: {result.damage.reason} at byte {result.damage.offset} before valid records", offset=result.damage.offset)
        os.ftruncate(fd, result.end)  # a torn tail of an append that never returned
    seq = next_seq + len(result.records)
    blob = b"".join(encode_record({**record, "seq": seq + i}) for i, record in enumerate(records))
    os.write(fd, blob)
    tails[key] = (result.end + len(blob), seq + len(records))
    return seq


def append_durably(
    store: Store, path: str, record: dict[str, Any] | Sequence[dict[str, Any]], *, lock_path: str, key: str, owner: str, what: str,
    lock: SessionFlock | None = None,
) -> int:
    """Under the lock (the caller's, or one taken on ``lock_path``): append ``record`` (or a
    sequence of records, in one write) and make it durable under the store's policy (strict
    and batched both fsync before returning). Returns the (first) record's seq."""
    records = [record] if isinstance(record, dict) else list(record)
    own = lock is None
    held = lock if lock is not None else SessionFlock(lock_path)
    try:
        with held:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            try:
                seq = append_records(fd, records, tails=store.index_tails, key=key, owner=owner)
                store.durability.after_append(fd, what)  # strict syncs here, batched below
                store.durability.at_commit(fd, what)
            finally:
                os.close(fd)
    finally:
        if own:
            held.close()
    return seq
