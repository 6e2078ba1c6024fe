"""How the CLI logs to stderr: one text line or one JSON object per record.

The library logs through stdlib ``logging`` with structured fields attached
(``extra=``, and the task's child/parent/epoch through ``FieldsFilter``);
these formatters print those fields. ``setup_logging`` replaces the root
logger's handlers, so it is called once, by ``main``, per process.
"""

from __future__ import annotations

import json
import logging
import sys

from subagents.worker.logcontext import FieldsFilter

__all__ = ["TextFormatter", "JsonFormatter", "setup_logging"]

_LOG_FIELDS = ("child", "parent", "epoch", "session")


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = " ".join(f"{k}={getattr(record, k)}" for k in _LOG_FIELDS if hasattr(record, k))
        return f"{text} [{fields}]" if fields else text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": record.created, "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        for key in _LOG_FIELDS:  # the structured fields the library attaches (``extra=``)
            if hasattr(record, key):
                doc[key] = getattr(record, key)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def setup_logging(level: str, as_json: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if as_json else TextFormatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(FieldsFilter())  # child/parent/epoch of the task that logs (worker/logcontext.py)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(int(level) if level.isdigit() else getattr(logging, level.upper()))
