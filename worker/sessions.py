"""How a turn reaches its own session: the ``SessionWriter`` seam and its local implementation.

A turn appends to its session's log under the lease epoch the supervisor gave
it (every append is fenced: a writer whose lease was taken over raises
``FencedError`` and never writes again), reads the log back for
``ctx.history()``, and a one-shot turn releases its lease through its writer
after its closing commit. ``SessionWriter`` is the open writer,
``SessionAccess`` opens writers and reads history. ``LocalSessions`` does all
of it on this host's file system; the writer it opens is the store's
``LogWriter`` — attached without reading the session when the turn carries
the log's state from its creation (``TurnSpec.log_state``). A host whose store
is elsewhere (a store service) supplies another ``SessionAccess``; nothing in
the turn changes. Called by ``worker/turn.py`` and ``worker/context.py`` only.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Protocol, Sequence

from subagents.store.errors import SubagentError
from subagents.store.header import SessionHeader, parse_header
from subagents.store.index_writers import IndexWriters
from subagents.store.lease import write_released
from subagents.store.log import LogWriter
from subagents.store.projection import Projection
from subagents.store.reader import inspect
from subagents.store.root import Store

__all__ = ["SessionWriter", "SessionAccess", "LocalWriter", "LocalSessions", "attachable"]


class SessionWriter(Protocol):
    """An open, fenced writer of one session's log (one per turn; not thread-safe)."""

    session_id: str
    epoch: int
    # the store's record limit: an append of a larger record is refused (``RECORD_TOO_LARGE``), and a program
    # sizes what it reads by it (the ``llm`` program's cap on an endpoint's reply)
    max_record_bytes: int

    def append(self, batch: Sequence[tuple[str, Any]], *, commit: bool = False) -> list[dict[str, Any]]:
        """Append ``(type, data)`` events with contiguous seqs; ``commit`` makes them durable under the store's policy.

        A remote writer may only queue them here (and raise an earlier batch's failure); ``flush`` awaits them.
        """
        ...

    async def flush(self) -> None:
        """Return once every append so far is in the log (a no-op where ``append`` already wrote it).

        The turn flushes before a tool runs (``tool/call`` is write-ahead), before a
        report, and after its closing commit.
        """
        ...

    def release_lease(self, owner: str) -> None:
        """Release ``owner``'s lease at this writer's epoch, once the closing commit is flushed
        (``FencedError`` if the lease moved on)."""
        ...

    def close(self) -> None: ...


class SessionAccess(Protocol):
    """What a turn needs of the store besides its writer."""

    # whether opening a writer, releasing and closing it are round trips to another host: the
    # turn then makes them off its event loop (``worker/turn.py``), where other turns run
    remote: bool

    def open_writer(self, session_id: str, *, epoch: int, log_state: dict[str, Any] | None = None) -> SessionWriter:
        """Open the session's log for appends at ``epoch`` (repairs a torn tail; ``FencedError`` if taken over).

        ``log_state`` is the session's header and projection as its creator
        left them (``TurnSpec.log_state``): an implementation may attach to the
        log with them instead of reading the session (the first append is
        fenced either way), or ignore them.
        """
        ...

    def history(self, session_id: str) -> list[dict[str, Any]]:
        """The valid prefix of the session's log (read-only)."""
        ...


class LocalWriter(LogWriter):
    """The store's ``LogWriter`` as a ``SessionWriter``: every append is written when it returns."""

    # the parents' indexes its ``LocalSessions`` keeps open, for the ``settled`` row of a release
    index_writers: IndexWriters | None = None

    @property
    def max_record_bytes(self) -> int:
        """The store's record limit (``Store.max_record_bytes``)."""
        return self.store.max_record_bytes

    async def flush(self) -> None:
        """Nothing waits: ``append`` wrote (and, at a commit point, synced) before returning."""

    def release_lease(self, owner: str) -> None:  # type: ignore[override]
        """Release the lease through the writer's open session file, under its lock (``LogWriter.release_lease``)."""
        super().release_lease(owner, partial(write_released, writers=self.index_writers))


class LocalSessions:
    """``SessionAccess`` over a ``Store`` on this host; its writer is ``LogWriter``.

    It keeps the children indexes of the last few parents open (``IndexWriters``): the
    one-shot children a worker releases are mostly siblings, and each release appends its
    ``settled`` row to their parent's index. ``close`` closes them.
    """

    remote = False  # a few microseconds of file calls: a thread hop would cost more than the call

    def __init__(self, store: Store) -> None:
        self.store = store
        self._indexes = IndexWriters(store)

    def open_writer(self, session_id: str, *, epoch: int, log_state: dict[str, Any] | None = None) -> SessionWriter:
        state = attachable(log_state)
        if state is None:
            writer = LocalWriter.open(self.store, session_id, epoch=epoch)
        else:
            header, projection = state
            writer = LocalWriter.attach(self.store, session_id, epoch=epoch, projection=projection, header=header)
        writer.index_writers = self._indexes
        return writer

    def history(self, session_id: str) -> list[dict[str, Any]]:
        return inspect(self.store, session_id).events

    def close(self) -> None:
        """Close the indexes kept open (a later release opens them again)."""
        self._indexes.close()


def attachable(log_state: dict[str, Any] | None) -> tuple[SessionHeader, Projection] | None:
    """The header and projection in a turn's ``log_state``; ``None`` (open the session instead) when absent or not valid."""
    if not isinstance(log_state, dict) or not isinstance(log_state.get("projection"), dict):
        return None
    try:
        # the supervisor made both from a session it just created: its own records, handed over
        # directly, so the projection skips the cache's type checks (``from_trusted_record``)
        projection = Projection.from_trusted_record(log_state["projection"])
        header = parse_header(log_state.get("header"))
    except (SubagentError, KeyError, TypeError):
        return None
    return header, projection
