"""How a process prints its log records: one text line or one JSON object each, with the child's fields.

The host (the CLI's ``--log-json``) and its workers (``SupervisorConfig.worker_log_json``)
print alike, so one stderr carries one format: a worker that kept text lines beside
the host's JSON ones broke every reader of that stream. The fields are those
``logcontext.bind`` attaches (``child``, ``parent``, ``epoch``) and a record's own
``session``; a record logged outside any child's task has none.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import TextIO

from .logcontext import FieldsFilter

__all__ = ["LOG_FIELDS", "TextFormatter", "JsonFormatter", "install_logging"]

LOG_FIELDS = ("child", "parent", "epoch", "session")


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = " ".join(f"{k}={getattr(record, k)}" for k in LOG_FIELDS if hasattr(record, k))
        return f"{text} [{fields}]" if fields else text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": record.created, "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        for key in LOG_FIELDS:  # the structured fields the library attaches (``extra=``)
            if hasattr(record, key):
                doc[key] = getattr(record, key)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


def install_logging(level: int, *, as_json: bool, stream: TextIO | None = None) -> None:
    """Make the root logger print to ``stream`` (stderr) at ``level``, in one of the two forms; it replaces
    the root's handlers, so it is called once per process, at its start."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if as_json else TextFormatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(FieldsFilter())  # child/parent/epoch of the task that logs
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
