"""How the CLI logs to stderr: one text line or one JSON object per record (``worker/logformat.py``,
which the workers print with too, so ``--log-json`` gives one format on one stream)."""

from __future__ import annotations

import logging

from subagents.worker.logformat import JsonFormatter, TextFormatter, install_logging

__all__ = ["TextFormatter", "JsonFormatter", "setup_logging"]


def setup_logging(level: str, as_json: bool) -> None:
    install_logging(int(level) if level.isdigit() else getattr(logging, level.upper()), as_json=as_json)
