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
"""

from .budget import StopCause, TurnControl, TurnStopped
from .context import BlockingTurnContext, RpcCaller, RunResult, TurnContext, TurnResult
from .errors import BudgetExhaustedError, ProgramLoadError, ToolDeniedError, WorkerCrashedError
from .main import WorkerLoop, worker_entry
from .programs import BUILTIN_PROGRAMS, load_program
from .runner import TurnRunner
from .sessions import LocalSessions, SessionAccess, SessionWriter
from .tools import Tool, Toolbox, builtin_tools
from .turn import MAX_DIAGNOSTIC_BYTES, run_turn, truncate_diagnostic

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
