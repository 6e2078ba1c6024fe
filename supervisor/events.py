"""Lifecycle events: named events with isolated listeners.

``emit`` calls every listener; one that raises is logged (with its traceback)
and never affects the run or the other listeners — the one documented
isolation boundary. That includes a ``BaseException`` of the listener's own:
events are emitted from inside the supervisor's bookkeeping (a start between
creation and submission, a teardown before its child is marked disposed), which
an exception passing through would leave half done. Only ``KeyboardInterrupt``
and ``SystemExit`` go on, as everywhere: they stop the process. ``emit_strict``
lets the first failure propagate (the reference rolls a provider registration
back when a provider-added listener throws).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

__all__ = ["EventBus", "EVENT_NAMES"]

# every name ``emit`` is called with: ``on`` refuses any other (a misspelt name would never fire)
EVENT_NAMES = ("subagent/start", "subagent/end", "subagent/provider-added", "subagent/provider-removed")

log = logging.getLogger(__name__)

Listener = Callable[[str, dict[str, Any]], Any]


class EventBus:
    def __init__(self) -> None:
        self._listeners: list[tuple[str | None, Listener]] = []

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
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException:
                log.exception("subagent: %s listener threw", name)

    def emit_strict(self, name: str, payload: dict[str, Any]) -> None:
        for listener in self._matching(name):
            listener(name, payload)
