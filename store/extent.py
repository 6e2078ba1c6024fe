"""Where a padded file's data ends, when more zeros follow it than its padding explains.

A session's log and its mailbox end in zero padding shorter than ``BLOCK``
(FORMAT.md §3.4, §8), and every reader treats zeros after the last record
as the end. ``truncate``, ``fallocate`` or a file system's recovery can
make such a file far longer behind the store's back, the rest zeros (holes,
or zeros written out). Nothing is lost, but a reader that reads to the
file's size reads them all into memory, and a writer that appends there
writes over them as over padding. Readers stop at ``reach`` instead: where
a record that starts before the last non-zero byte could still end (a frame
of the store's record limit). The data's end is found from the last data
extent backwards (``SEEK_DATA``/``SEEK_HOLE``: holes are never read) and a
bounded chunk at a time, so a GiB of holes costs a few calls.

Everything here works on an open descriptor and never reads the file's
timestamps (no ``fstat``): the held mailbox's writer relies on that
(``store/changes.py``).

**Bounded reads of a log.** ``reach`` alone bounds nothing when a stray
non-zero byte lies far past the records (``f.seek(1 << 30); f.write(b"x")``:
a GiB that takes one block on disk): the data then "ends" there. So a
session's log, and a mailbox, are read by ``read_records``: the frames that verify from the
read's start (a bounded chunk at a time), then the frame where they stop,
and no further when more data lies beyond it. What lies beyond is
``Beyond``'s: ``scan`` learns where the data ends from it (zeros up to there
are damage, not the end), and the torn-tail test (``find_committed``) looks
for a committed frame after the damage a bounded window at a time, over the
file's data extents only (holes are never read) and reading past a window
only as far as its candidate frames announce. Memory: the records read,
then about one record of the store's limit and a window; time: the data
present, not the file's size.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
import zlib

import msgpack
from dataclasses import dataclass
from typing import Any, Callable

from .atomic import NOFOLLOW, pread_all
from .framing import _MAP_START, BLOCK, FRAME, MAX_RECORD_BYTES, Check, Damage, Skipped, SkimResult, data_end, find_committed, scan_all, torn_tail

__all__ = ["data_end_of", "reach", "last_data_end", "read_records", "Beyond", "skim_file", "skim_path"]

_SCAN_CHUNK = 1 << 20  # one read of a run of zeros: a bounded buffer, whatever the file's size
_WINDOW = 1 << 20  # the candidate offsets ``Beyond.find_committed`` tries per read


def data_end_of(fd: int, size: int | None = None) -> int:
    """Where the open file's data ends (``size``: its size, when the caller has it): one ``pread`` of its
    last two blocks (its padding is under one) when they hold data, else ``last_data_end``."""
    if size is None:
        size = os.lseek(fd, 0, os.SEEK_END)
    window = min(size, 2 * BLOCK)
    end = data_end(os.pread(fd, window, size - window))
    if end or window == size:
        return size - window + end
    return last_data_end(fd, size - window)


def reach(fd: int, limit: int, start: int = 0) -> int:
    """Where a read of the open file from ``start`` may stop: the file's end, or, when more zeros follow
    its data than padding explains, as far past the data's end as a record that starts before it
    can reach (a frame of ``limit`` bytes, and a block); only zeros lie beyond. One ``lseek`` when the
    read is no longer than that bound anyway (a mailbox's pending messages, a log's last records)."""
    slack = FRAME.size + limit + BLOCK
    size = os.lseek(fd, 0, os.SEEK_END)
    if size - start <= slack:
        return size
    return min(size, data_end_of(fd, size) + slack)


def last_data_end(fd: int, stop: int) -> int:
    """Where the last non-zero byte before ``stop`` ends (0: there is none). The file's data extents from
    the last, each read backwards a bounded chunk at a time; holes are skipped unread. Zeros written
    out as data are still read, a chunk at a time."""
    for start, end in reversed(_data_extents(fd, stop)):
        while end > start:
            low = max(start, end - _SCAN_CHUNK)
            found = data_end(os.pread(fd, end - low, low))
            if found:
                return low + found
            end = low
    return 0


def _data_extents(fd: int, stop: int, pos: int = 0) -> list[tuple[int, int]]:
    """The file's data extents between ``pos`` and ``stop``, as ``[start, end)`` (``SEEK_DATA``/``SEEK_HOLE``);
    the whole range where the file system cannot tell holes from data."""
    extents: list[tuple[int, int]] = []
    first = pos
    while pos < stop:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data from pos on
                break
            return [(first, stop)]  # EINVAL: holes unknown here
        if start >= stop:
            break
        end = min(os.lseek(fd, start, os.SEEK_HOLE), stop)
        extents.append((start, end))
        pos = end
    return extents


def read_records(fd: int, start: int, limit: int) -> tuple[bytes, "Beyond | None"]:
    """The bytes of a padded region (a session's log) from ``start`` a reader needs, and ``Beyond`` when
    data lies past them (``None``: they hold all of it, and every zero a frame of ``limit`` could end in).

    Up to ``reach`` when that is one record's reach from ``start``, or when the frames from ``start`` run
    to the data's end (a log is read whole). Else only to the frame where the frames that verify stop
    (length within ``limit``, CRC right): its header, and its payload when its length is one a record
    can have; the rest is ``Beyond``'s. A log whose records are all there pays a CRC of them more."""
    slack = FRAME.size + limit + BLOCK
    size = os.lseek(fd, 0, os.SEEK_END)
    if size - start <= slack:
        return pread_all(fd, start, stop=size), None
    last = data_end_of(fd, size)
    stop = min(size, last + slack)
    if stop - start <= slack:
        return pread_all(fd, start, stop=stop), None
    cut = _frames_end(fd, start, last, limit)
    if cut >= last:
        return pread_all(fd, start, stop=stop), None
    return pread_all(fd, start, stop=cut), Beyond(fd, start, last - start, stop - start, limit)


def _frames_end(fd: int, pos: int, last: int, limit: int) -> int:
    """Where the frames that verify from ``pos`` stop, plus the bytes of the frame found there a scan
    reads to name its damage; a bounded chunk at a time (a record longer than a chunk is read alone)."""
    chunk, at = memoryview(b""), pos
    while pos < last:
        if pos + FRAME.size > at + len(chunk):
            chunk, at = memoryview(os.pread(fd, _SCAN_CHUNK, pos)), pos
            if len(chunk) < FRAME.size:
                return pos + FRAME.size
        length, crc = FRAME.unpack_from(chunk, pos - at)
        if not 0 < length <= limit:
            return pos + FRAME.size
        body_at = pos + FRAME.size - at
        body = chunk[body_at : body_at + length] if body_at + length <= len(chunk) else os.pread(fd, length, pos + FRAME.size)
        if len(body) != length or zlib.crc32(body) != crc:
            return pos + FRAME.size + length
        pos += FRAME.size + length
    return pos


@dataclass(frozen=True)
class Beyond:
    """The data of a region past what ``read_records`` read: offsets relative to the read's start.

    ``last``: where the data ends (after its last non-zero byte); ``end``: how far ``reach`` would
    have read (past ``last`` by a record's reach, or the file's end). The descriptor is the caller's:
    open while this is used."""

    fd: int
    base: int
    last: int
    end: int
    limit: int

    def find_committed(self, start: int, expected_seq: int, predicate: Callable[[dict[str, Any]], bool], *,
                       torn_reason: str) -> int | None:
        """``framing.find_committed`` of the region from ``start`` (padded), a window of candidate offsets
        at a time. A candidate's payload starts with a non-zero byte, so only offsets whose payload
        would start in a data extent are tried; a window is read past its end only as far as its
        candidates' lengths (within the limit) and one more frame reach, and not at all without one."""
        span = FRAME.size + self.limit
        for first, after in _data_extents(self.fd, self.base + self.last, self.base + start + FRAME.size):
            lo = max(start, first - self.base - FRAME.size)
            stop = after - self.base - FRAME.size
            while lo < stop:
                hi = min(stop, lo + _WINDOW)
                head = os.pread(self.fd, hi - lo + FRAME.size, self.base + lo)
                needed = 0
                for found in _MAP_START.finditer(head, FRAME.size):
                    length = FRAME.unpack_from(head, found.start() - FRAME.size)[0]
                    if 0 < length <= self.limit:
                        needed = max(needed, found.start() + length)
                if needed:
                    window = os.pread(self.fd, min(self.end, lo + needed + span) - lo, self.base + lo)
                    hit = find_committed(window, 0, expected_seq, predicate, torn_reason=torn_reason, padded=True,
                                         last=self.last - lo, stop=hi - lo, limit=self.limit)
                    if hit is not None:
                        return lo + hit
                lo = hi
        return None


def skim_file(fd: int, *, check: Check | None = None, judge_tail: bool = False) -> SkimResult:
    """``framing.scan_all`` of a file of independent records (a children index, ``index/roots``, a
    ``.control`` file), read as a log is (``read_records``): the frames that verify, then the frame where
    they stop; past it, the next frame that chains is looked for a window at a time over the file's data
    (``Beyond.find_committed``) and the file is read on from there. The verdict of ``scan_all`` of the
    whole file; memory: the records, not the file's apparent size (a stray byte far past them).
    ``judge_tail``: say whether the damage at the end is a torn tail (``SkimResult.tail_torn``), with what
    lies past it in the file, as ``torn_tail`` of the whole file would."""
    data, beyond = read_records(fd, 0, MAX_RECORD_BYTES)
    if beyond is None:
        skim = scan_all(data, check=check)
        if judge_tail and skim.tail is not None:
            return dataclasses.replace(skim, tail_torn=torn_tail(data, skim.tail, skim.next_seq))
        return skim
    size = os.lseek(fd, 0, os.SEEK_END)
    records: list[dict[str, Any]] = []
    skipped: list[Skipped] = []
    base = expected = 0
    while True:
        skim = scan_all(data, check=check, start_seq=expected)
        records += skim.records
        skipped += [Skipped(s.seqs, _moved(s.damage, base)) for s in skim.skipped]
        tail, expected = skim.tail, skim.next_seq
        if tail is None:
            if beyond is None:
                return SkimResult(records, skipped, None, base + skim.end, expected)
            base += skim.end  # a frame found inside the damage chained to where the read stopped
        else:
            found = None if beyond is None else beyond.find_committed(tail.offset + 1, expected, lambda _p: True,
                                                                       torn_reason=tail.reason)
            if found is None:
                damage = Damage(base + tail.offset, size - base - tail.offset, tail.reason, tail.detail)
                torn = torn_tail(data, tail, expected, beyond=beyond) if judge_tail else None
                return SkimResult(records, skipped, damage, base + skim.end, expected, torn)
            resumed = _seq_at(fd, base + found)
            skipped.append(Skipped(range(expected, resumed), Damage(base + tail.offset, found - tail.offset, tail.reason, tail.detail)))
            base, expected = base + found, resumed
        data, beyond = read_records(fd, base, MAX_RECORD_BYTES)


def skim_path(path: str, *, check: Check | None = None, judge_tail: bool = False) -> SkimResult:
    """``skim_file`` of the file at ``path``, opened as ``atomic.read_bytes`` opens one (no link, no
    wait for a FIFO); ``OSError`` as the OS says, ``EINVAL`` for what is not a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.pread(fd, 1, 0)  # a folder fails here, as the OS says (EISDIR)
            raise OSError(errno.EINVAL, "not a regular file")
        return skim_file(fd, check=check, judge_tail=judge_tail)
    finally:
        os.close(fd)


def _moved(damage: Damage, base: int) -> Damage:
    return Damage(base + damage.offset, damage.dropped, damage.reason, damage.detail)


def _seq_at(fd: int, pos: int) -> int:
    """The seq of the frame at ``pos`` (one ``find_committed`` found: it verifies)."""
    length = FRAME.unpack(os.pread(fd, FRAME.size, pos))[0]
    return msgpack.unpackb(os.pread(fd, length, pos + FRAME.size), raw=False, strict_map_key=False)["seq"]
