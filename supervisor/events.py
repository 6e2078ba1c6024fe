"""Lifecycle events: named events with isolated listeners.

``emit`` calls every listener; one that raises is logged (with its traceback)
and never affects the run or the other listeners — the one documented
isolation boundary. That includes a ``BaseException`` of the listener's own:
events are emitted from inside the supervisor's bookkeeping (a start between
creation and submission, a teardown before its child is marked disposed), which
an exception passing through would leave half done. ``KeyboardInterrupt`` and
``SystemExit`` stop the process, as everywhere, but not from there: ``stop``
hands them to the supervisor, which stops its host's program and closes in order,
then raises them (raised from a disposal or the pool's reader, they skipped the
close, left resident children ``crashed``, and the process hung at exit).
``emit_strict`` lets the first failure propagate (the reference rolls a provider
registration back when a provider-added listener throws).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

__all__ = ["EventBus", "EVENT_NAMES", "HostStop"]

# every name ``emit`` is called with: ``on`` refuses any other (a misspelt name would never fire)
EVENT_NAMES = ("subagent/start", "subagent/end", "subagent/provider-added", "subagent/provider-removed")

log = logging.getLogger(__name__)

Listener = Callable[[str, dict[str, Any]], Any]


class HostStop:
    """Where a listener's ``KeyboardInterrupt`` or ``SystemExit`` goes: ``body``, the scope of the host's
    ``async with`` block, is cancelled, and ``raised`` is raised once the supervisor closed."""

    def __init__(self) -> None:
        self.body: Any = None  # an anyio CancelScope, once the block runs
        self.raised: BaseException | None = None

    def stop(self, exc: BaseException) -> None:
        if self.raised is None:
            self.raised = exc
            if self.body is not None:
                self.body.cancel()


class EventBus:
    def __init__(self, *, stop: Callable[[BaseException], None] | None = None) -> None:
        self._listeners: list[tuple[str | None, Listener]] = []
        self._stop = stop

    def on(self, name: str | None, listener: Listener) -> Callable[[], None]:
        """Subscribe to one event name (or all with ``None``); returns the unsubscribe callable."""
        entry = (name, listener)
        self._listeners.append(entry)

        def off() -> None:
            if entry in self._listeners:
                self._listeners.remove(entry)

        return off

    def _matching(self, name: str) -> list[Listener]:
        return [fn for (n, fn) in list(self._listeners) if n is None or n == name]

    def emit(self, name: str, payload: dict[str, Any]) -> None:
        for listener in self._matching(name):
            try:
                listener(name, payload)
            except (KeyboardInterrupt, SystemExit) as exc:
                if self._stop is None:
                    raise
                self._stop(exc)
            except BaseException:
                log.exception("subagent: %s listener threw", name)

    def emit_strict(self, name: str, payload: dict[str, Any]) -> None:
        for listener in self._matching(name):
            listener(name, payload)
