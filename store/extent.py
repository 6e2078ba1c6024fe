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
"""

from __future__ import annotations

import errno
import os

from .framing import BLOCK, FRAME, data_end

__all__ = ["data_end_of", "reach", "last_data_end"]

_SCAN_CHUNK = 1 << 20  # one read of a run of zeros: a bounded buffer, whatever the file's size


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


def _data_extents(fd: int, stop: int) -> list[tuple[int, int]]:
    """The file's data extents below ``stop``, as ``[start, end)`` (``SEEK_DATA``/``SEEK_HOLE``); the whole
    range where the file system cannot tell holes from data."""
    extents: list[tuple[int, int]] = []
    pos = 0
    while pos < stop:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data from pos on
                break
            return [(0, stop)]  # EINVAL: holes unknown here
        if start >= stop:
            break
        end = min(os.lseek(fd, start, os.SEEK_HOLE), stop)
        extents.append((start, end))
        pos = end
    return extents
