"""Structured logging fields for everything logged on behalf of one child.

A task that works for a child (a worker's turn, a supervisor's driver of an
activation or of a one-shot run) calls ``bind(child=..., parent=..., epoch=...)``
once; every record logged from that task — and from tasks and threads it
starts, which copy its context — then carries those fields, added by
``FieldsFilter`` (installed on the handlers by the CLI and the worker entry).
A record that passes its own ``extra=`` keeps its values.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any

__all__ = ["FIELDS", "bind", "FieldsFilter"]

FIELDS = ("child", "parent", "epoch")

_current: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("subagents_log_fields", default=None)


def bind(**fields: Any) -> None:
    """Attach fields to every record logged from the current task (and what it starts)."""
    _current.set({k: v for k, v in fields.items() if v is not None})


class FieldsFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        fields = _current.get()
        if fields:
            for key, value in fields.items():
                if not hasattr(record, key):
                    setattr(record, key, value)
        return True
