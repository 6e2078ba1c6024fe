"""fsyncs of a batch of new files issued at once, on a few threads of their own.

A batch of new sessions (``publish_sessions``) needs one fsync per file,
each after its link. Issued one after another, each waits for the disk in
turn: on this repository's disk (ext4 without a journal, on a virtual disk
that other programs share) eight new files fsync'd in a row took 3.6 ms at
the median, and 22 ms while other programs kept the disk busy; the same
eight issued together took 0.8-0.9 ms either way, because the disk serves
queued writes together (neighbouring inodes share a block of the inode
table). Creation was where a one-shot child spent most of its wait, so the
wall time of these fsyncs is what ``start`` waited for.

Only the waiting overlaps: each file is still fsync'd after its own link,
and ``sync_all`` returns only once every fsync it issued has ended, so
whatever a caller does after it (the fsync of ``sessions/``, the index
append) still comes after every file's fsync, as FORMAT.md §4 orders them.
A failed fsync is reported for its file alone and never retried.

The caller's own thread fsyncs the first file; the others go to the threads
(started when first needed, ``threads`` at most). A thread that cannot be
started (the process is out of threads) leaves its files to the caller,
one after another as before. Owned by whoever made it (the supervisor's
``SessionCreator``), which closes it.
"""

from __future__ import annotations

import queue
import threading
from typing import Sequence

from .atomic import NewFile

__all__ = ["ConcurrentSync", "DEFAULT_SYNC_THREADS"]

# more in flight stopped helping on this disk past eight; a batch beyond that queues for the threads
DEFAULT_SYNC_THREADS = 8


class _Batch:
    """One ``sync_all`` call's files given to the threads: their outcomes, and how many are still running."""

    def __init__(self, count: int) -> None:
        self.outcomes: list[BaseException | None] = [None] * count
        self.running = 0
        self.ended = threading.Condition(threading.Lock())

    def end(self, index: int, outcome: BaseException | None) -> None:
        with self.ended:
            self.outcomes[index] = outcome
            self.running -= 1
            if not self.running:
                self.ended.notify()


class ConcurrentSync:
    """Issues the fsyncs of several new files at once; each file's outcome on its own.

    ``threads=0``: none, every fsync in the caller's thread one after another (``publish_sessions``
    without a ``ConcurrentSync`` of its caller's).
    """

    def __init__(self, threads: int = DEFAULT_SYNC_THREADS) -> None:
        self._max_threads = threads
        self._jobs: queue.SimpleQueue[tuple[_Batch, int, NewFile] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # the thread list; starting and stopping them
        self._threads: list[threading.Thread] = []
        self._closed = False

    def sync_all(self, files: Sequence[NewFile]) -> list[BaseException | None]:
        """fsync every file of ``files`` (each already linked to its name); per file, None or what failed.

        Returns only once every fsync it issued has ended, also when this thread is interrupted
        while waiting: its caller closes the files after this, never under a thread still syncing one.
        """
        batch = _Batch(len(files))
        mine = list(range(len(files)))
        with self._lock:
            if len(files) > 1 and self._started():
                mine = [0]
                batch.running = len(files) - 1
                for i in range(1, len(files)):  # under the lock: never behind ``close``'s ends of the threads
                    self._jobs.put((batch, i, files[i]))
        try:
            for i in mine:
                batch.outcomes[i] = _sync(files[i])
        finally:
            with batch.ended:
                while batch.running:
                    batch.ended.wait()
        return batch.outcomes

    def close(self) -> None:
        """Stop the threads once the fsyncs given to them have ended (blocks); later calls sync in the caller's thread."""
        with self._lock:
            self._closed = True
            threads, self._threads = self._threads, []
        for _ in threads:
            self._jobs.put(None)
        for thread in threads:
            thread.join()

    def _started(self) -> bool:
        """Whether threads run to take files (called under ``_lock``): started at the first call that has
        work for them; one that cannot be started (no thread left) leaves the files to those running,
        or to the caller when none does."""
        while not self._closed and len(self._threads) < self._max_threads:
            thread = threading.Thread(target=self._serve, name=f"subagents-fsync-{len(self._threads)}", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # can't start new thread
                break
            self._threads.append(thread)
        return bool(self._threads)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            batch, index, new_file = job
            batch.end(index, _sync(new_file))


def _sync(new_file: NewFile) -> BaseException | None:
    try:
        new_file.sync()
    except Exception as exc:  # reported for this file alone, as the fsyncs issued one by one were
        return exc
    return None
