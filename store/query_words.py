"""The words a listing's query takes: outcomes, statuses, sort orders, and how many roots a listing shows unless told.

Apart from ``outcome``, ``query`` and ``roots`` (which load the records' models,
pydantic and msgpack) so that a command line's parser offers them as choices
without loading the store: ``subagents --help`` builds every verb's options.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["Outcome", "OUTCOMES", "SORTS", "STATUSES", "DEFAULT_ROOT_LIMIT"]

Outcome = Literal[
    "completed", "error", "aborted", "drained", "interrupted", "crashed",
    "budget", "timeout", "refused", "max-tokens", "not-started",
]
OUTCOMES: tuple[str, ...] = Outcome.__args__  # type: ignore[attr-defined]

SORTS = ("created", "label", "status")
STATUSES = ("running", "idle", "complete")

DEFAULT_ROOT_LIMIT = 20  # the newest top-level sessions a listing shows unless told how many
