"""The control files of the one-shot runs a supervisor hosts: polled, each new request applied.

Another process (the CLI, another supervisor) cannot reach a one-shot turn
this supervisor runs except through the store: it appends an ``interrupt``
record to the child's control file (``store/control.py``). ``OneShotRuns``
registers each run here when it is published and removes it when the run
is done; every ``poll_s`` the poller compares each registered file's size
with what it last saw (one ``stat`` per running child, off the event loop,
none when no run is held) and hands records it has not applied yet to that
run's callback, on the event loop.

A one-shot child has one turn, so every record its control file holds is
about that turn: it is watched from the start of its file. Each child is an isolation
boundary: a file that cannot be read is logged and skipped until it changes.
The continuable children are registered here too, by their store watcher
(``continuable/watcher.py``), from the records that predate their activation
on.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable

import anyio

from subagents.store import Store
from subagents.store.control import ControlRecord, read_controls

__all__ = ["ControlPoller", "ApplyRecord"]

log = logging.getLogger(__name__)

ApplyRecord = Callable[[ControlRecord], None]


@dataclass
class _Watched:
    apply: ApplyRecord
    size: int = 0  # the control file's size when last read (0: missing)
    seq: int = -1  # the last record handed to ``apply``


class ControlPoller:
    """Owns which sessions are watched and how far each was read; written only by its methods."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._watched: dict[str, _Watched] = {}

    def watch(self, session_id: str, apply: ApplyRecord, *, size: int = 0, seq: int = -1) -> None:
        """Apply every record of ``session_id``'s control file past ``seq`` (by default all, those
        already there too), read again whenever its size is no longer ``size``."""
        self._watched[session_id] = _Watched(apply, size, seq)

    def unwatch(self, session_id: str) -> None:
        self._watched.pop(session_id, None)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._watched

    async def run(self, poll_s: float) -> None:
        """Poll until cancelled."""
        while True:
            await anyio.sleep(poll_s)
            if self._watched:
                await self.poll()

    async def poll(self) -> None:
        """Read what changed in a thread; apply it here, on the event loop (callbacks touch the pool)."""
        found = await anyio.to_thread.run_sync(self._read_changed, list(self._watched.items()))
        for session_id, watched, records in found:
            for record in records:
                if self._watched.get(session_id) is not watched:
                    break  # a record ended the run (and its watch)
                watched.apply(record)

    def _read_changed(self, watched: list[tuple[str, _Watched]]) -> list[tuple[str, _Watched, list[ControlRecord]]]:
        found = []
        for session_id, entry in watched:
            try:
                records = self._read_one(session_id, entry)
            except Exception:  # isolation boundary: one child's damaged files never end the supervisor
                log.warning("the control file of %s could not be read; skipped until it changes", session_id, exc_info=True,
                            extra={"child": session_id})
                continue
            if records:
                found.append((session_id, entry, records))
        return found

    def _read_one(self, session_id: str, watched: _Watched) -> list[ControlRecord]:
        """The records past ``watched.seq`` when the file changed (``size`` and ``seq`` are written only here)."""
        try:
            size = os.stat(self._store.path(session_id, "control")).st_size
        except OSError:  # missing (nobody asked), or damage in its place: nothing to see until it changes
            size = 0
        if size == watched.size:
            return []
        watched.size = size  # first: a file that fails to parse is not re-read until it changes
        records = read_controls(self._store, session_id, after_seq=watched.seq)
        if records:
            watched.seq = records[-1].seq
        return records
