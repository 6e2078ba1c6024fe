"""The child agent runtime inside a worker process.

Layout: ``main`` (the process entry point and its pipe loop), ``runner``
(``TurnRunner``: the turns resident in a process, whatever hosts it),
``protocol`` (the pipe messages; the single definition, imported by the
supervisor), ``turn`` (one turn of one child), ``sessions`` (the
``SessionWriter`` seam to the store), ``context`` (``TurnContext``, what a program sees),
``budget`` (stop causes), ``tools`` (tool filter and sandbox), ``programs``
(built-in programs and the loader), ``errors``. The names below are what
program authors and the supervisor use; protocol messages stay in
``worker.protocol``.

The names resolve on first use (PEP 562): the supervisor and the CLI import
single modules of this package (``worker.errors``, ``worker.logformat``), and
loading every module here would start the worker's event loop, its programs
and their clients in every process that only reads a store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from subagents.exports import lazy_exports

if TYPE_CHECKING:
    from .budget import StopCause, TurnControl, TurnStopped
    from .context import BlockingTurnContext, RpcCaller, RunResult, TurnContext, TurnResult
    from .errors import BudgetExhaustedError, ProgramLoadError, ToolDeniedError, WorkerCrashedError
    from .main import WorkerLoop, worker_entry
    from .programs import BUILTIN_PROGRAMS, load_program
    from .runner import TurnRunner
    from .sessions import LocalSessions, SessionAccess, SessionWriter
    from .tools import Tool, Toolbox, builtin_tools
    from .turn import MAX_DIAGNOSTIC_BYTES, run_turn, truncate_diagnostic

# module -> the names it gives this package
_EXPORTS: dict[str, tuple[str, ...]] = {
    ".budget": ("StopCause", "TurnControl", "TurnStopped"),
    ".context": ("BlockingTurnContext", "RpcCaller", "RunResult", "TurnContext", "TurnResult"),
    ".errors": ("BudgetExhaustedError", "ProgramLoadError", "ToolDeniedError", "WorkerCrashedError"),
    ".main": ("WorkerLoop", "worker_entry"),
    ".programs": ("BUILTIN_PROGRAMS", "load_program"),
    ".runner": ("TurnRunner",),
    ".sessions": ("LocalSessions", "SessionAccess", "SessionWriter"),
    ".tools": ("Tool", "Toolbox", "builtin_tools"),
    ".turn": ("MAX_DIAGNOSTIC_BYTES", "run_turn", "truncate_diagnostic"),
}

__all__ = [
    "StopCause",
    "TurnControl",
    "TurnStopped",
    "BlockingTurnContext",
    "RpcCaller",
    "RunResult",
    "TurnContext",
    "TurnResult",
    "BudgetExhaustedError",
    "ProgramLoadError",
    "ToolDeniedError",
    "WorkerCrashedError",
    "WorkerLoop",
    "worker_entry",
    "TurnRunner",
    "SessionWriter",
    "SessionAccess",
    "LocalSessions",
    "BUILTIN_PROGRAMS",
    "load_program",
    "Tool",
    "Toolbox",
    "builtin_tools",
    "MAX_DIAGNOSTIC_BYTES",
    "run_turn",
    "truncate_diagnostic",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
