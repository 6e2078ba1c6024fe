"""Session creation in batches: many children's creations per thread hop.

Creating a child is blocking store work (folders, files, fsyncs), so it runs
in a thread. One hop per child made every ``start`` pay a thread wake-up and
a GIL hand-off back to the event loop, and with dozens of starts in flight
the loop spent more time waiting for the GIL than running. Here the starts
queue their requests; at most ``threads`` drain tasks each take everything
queued so far and create it with one ``store.session.create_sessions`` call
in one hop. The batch also shares its commit work: one fsync of the
``sessions`` folder and one index append per parent.

Each request still succeeds or fails on its own and is as durable as with
``create_session`` when its ``create`` returns. A drain is shielded from
cancellation: a creation that started always finishes, and its caller decides
whether to keep or roll back the session (``supervisor/oneshot.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio

from subagents.store import Store
from subagents.store.header import SessionHeader
from subagents.store.session import NewSession, create_sessions

__all__ = ["SessionCreator"]

# Enough drains to keep several fsyncs in flight (the disk serves them in parallel),
# few enough that the event loop is not out-voted for the GIL by store threads.
DEFAULT_THREADS = 4
# A bound on one hop's work, so one drain does not hold many starts behind a long batch.
MAX_BATCH = 32


@dataclass(eq=False)
class _Slot:
    request: NewSession
    done: anyio.Event = field(default_factory=anyio.Event)
    outcome: SessionHeader | BaseException | None = None


class SessionCreator:
    """Creates sessions for the event loop, batching concurrent requests into few thread hops."""

    def __init__(self, store: Store, tg: anyio.abc.TaskGroup, *, threads: int = DEFAULT_THREADS) -> None:
        self._store = store
        self._tg = tg
        self._threads = threads
        self._pending: list[_Slot] = []
        self._draining = 0

    async def create(self, request: NewSession) -> SessionHeader:
        """Create one session (durably, under the store's policy); raises what stopped it."""
        slot = _Slot(request)
        self._pending.append(slot)
        if self._draining < self._threads:
            self._draining += 1
            self._tg.start_soon(self._drain)
        with anyio.CancelScope(shield=True):
            await slot.done.wait()
        assert slot.outcome is not None
        if isinstance(slot.outcome, BaseException):
            raise slot.outcome
        return slot.outcome

    async def _drain(self) -> None:
        try:
            with anyio.CancelScope(shield=True):
                while self._pending:
                    batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                    try:
                        outcomes: list[SessionHeader | BaseException] = await anyio.to_thread.run_sync(
                            create_sessions, self._store, [s.request for s in batch]
                        )
                    except Exception as exc:  # the hop itself failed: every request it carried fails with it
                        outcomes = [exc] * len(batch)
                    for slot, outcome in zip(batch, outcomes):
                        slot.outcome = outcome
                        slot.done.set()
        finally:
            self._draining -= 1
