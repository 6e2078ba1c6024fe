"""Admission: whether new continuable work (a start, a message, a resume) may begin below a parent.

Closed everywhere, forever, once the supervisor closes (``close``). Closed
below a drained parent from the moment ``drain`` begins until that parent
itself is disposed: a drained continuable parent reopens when its own
activation goes away (``reopen``); a drained root of the host stays closed
until the supervisor closes, so the set is bounded by the roots the host
opened. Also counts the materialisations in flight, which a drain or a
close waits for. Written by ``teardown.py`` (close, drain, reopen) and by
``materialization.py`` (the in-flight set); read by every entry point.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator

import anyio

from ..errors import DrainingError, DuplicateChildError
from .activation import ActivationTable

__all__ = ["Admission"]


class Admission:
    def __init__(self, table: ActivationTable) -> None:
        self._table = table
        self._closing = False
        self._draining: set[str] = set()  # parents being drained (live when drained)
        self._materializing: dict[str, anyio.Event] = {}  # child id -> set when its materialisation ends

    @property
    def closing(self) -> bool:
        return self._closing

    def admit(self, parent_id: str) -> None:
        """Raise ``DrainingError`` unless new work may begin below ``parent_id``."""
        if self._closing:
            raise DrainingError()
        for node in self._table.lineage(parent_id):
            if node in self._draining:
                raise DrainingError(node)

    def closed_below(self, agent_id: str) -> bool:
        """Whether ``agent_id`` is below a closing lineage (its settlement notices then arrive quiet)."""
        if self._closing or any(node in self._draining for node in self._table.lineage(agent_id)):
            return True
        act = self._table.get(agent_id)
        return act is not None and act.disposing

    def close(self) -> None:
        self._closing = True
        self._draining.clear()

    def drain_below(self, parents: Iterable[str]) -> None:
        self._draining.update(parents)

    def reopen(self, parent_id: str) -> None:
        """A drained parent was disposed: nothing remains below it to keep closed."""
        self._draining.discard(parent_id)

    @contextmanager
    def materializing(self, child_id: str) -> Iterator[None]:
        """Mark a materialisation in flight (a drain or close waits for it to publish or roll back).

        A caller may reserve a child's id, so two starts of one id can overlap: the second is
        ``DUPLICATE_CHILD`` here, before it writes anything.
        """
        if child_id in self._materializing:
            raise DuplicateChildError(child_id)
        done = anyio.Event()
        self._materializing[child_id] = done
        try:
            yield
        finally:
            del self._materializing[child_id]
            done.set()

    def in_flight(self, child_id: str) -> anyio.Event | None:
        """The event set when ``child_id``'s materialisation ends, while one is under way.

        A message to a child whose start is still writing waits for it rather than resuming the
        child from the store: the start holds the lease, and taking it again would fence it.
        """
        return self._materializing.get(child_id)

    async def wait_materializing(self) -> None:
        for event in list(self._materializing.values()):
            await event.wait()
