"""Errors of the worker room.

    SubagentError (store/errors.py)
    ├── BudgetExhaustedError    a turn ran past max_steps or timeout_ms
    ├── ToolDeniedError         a filtered or sandbox-forbidden tool was called
    ├── UnsendableArgumentError INVALID_REQUEST: a program's request to the supervisor has an argument no message holds (also TypeError)
    ├── ProgramLoadError        a program reference cannot be imported
    ├── ProtocolError           bytes on a worker pipe that are not a message of its protocol (also ValueError)
    └── WorkerCrashedError      a worker process died under a call (pid, exit code, signal; node and cause on a cluster)
"""

from __future__ import annotations

import signal

from subagents.store.errors import SubagentError

__all__ = ["BudgetExhaustedError", "ToolDeniedError", "ToolArgumentsError", "UnsendableArgumentError", "TurnGoneError", "ProgramLoadError", "ProtocolError", "WorkerCrashedError", "describe_exit"]


class BudgetExhaustedError(SubagentError):
    """Raised inside a turn when it exceeds ``max_steps`` or ``timeout_ms``."""

    code = "BUDGET_EXHAUSTED"


class ToolDeniedError(SubagentError, PermissionError):
    """Raised when a program calls a tool its filter hides or its sandbox forbids."""

    code = "TOOL_DENIED"


class UnsendableArgumentError(SubagentError, TypeError):
    """Raised inside a turn, before anything is sent, when an argument of ``ctx.spawn``, ``ctx.send_message``,
    ``ctx.report`` and the like is no value a message holds (an ``object()``, a set): the same code as a
    request the supervisor refuses, since nothing was created either way."""

    code = "INVALID_REQUEST"

    def __init__(self, call: str, argument: str, cause: Exception) -> None:
        super().__init__(f"{call}: {argument} cannot be sent ({cause})", call=call, argument=argument)


class ToolArgumentsError(SubagentError, TypeError):
    """Raised when a tool is called with arguments its function does not take, before it runs: a model or
    a program reads which argument and what the tool takes, not a ``TypeError`` naming the function
    behind the tool (``_read_file() got an unexpected keyword argument``)."""

    code = "INVALID_REQUEST"

    def __init__(self, tool: str, problem: str, parameters: list[str]) -> None:
        takes = ", ".join(parameters) if parameters else "none"
        super().__init__(f'tool "{tool}" {problem} (its parameters: {takes})', tool=tool)


class TurnGoneError(SubagentError):
    """Raised when a program uses a ``TurnContext`` it kept after its turn ended (a global, a task it left running):
    the same code as a request that reaches the supervisor after the turn (``TURN_GONE``)."""

    code = "TURN_GONE"

    def __init__(self, message: str = "the calling turn is gone") -> None:
        super().__init__(message)

    @classmethod
    def forked(cls) -> "TurnGoneError":
        """A process a program forked uses its ``ctx``: the turn is its worker's (``worker/forks.py``)."""
        return cls("the calling turn is its worker's: this process was forked from it")


class ProgramLoadError(SubagentError, ImportError):
    """Raised when a ``module:function`` program reference cannot be loaded."""

    code = "PROGRAM_LOAD_FAILED"


class ProtocolError(SubagentError, ValueError):
    """Raised when bytes read from a worker pipe are not a message of ``worker/protocol.py``
    (an unknown ``op``, an unknown or missing field): a bug or a foreign peer, never user input."""

    code = "PROTOCOL"


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class WorkerCrashedError(SubagentError):
    """Raised for every call pending on a worker process that died.

    A local worker is named by its pid and exit status, or by ``cause`` when
    its exit status cannot be known (its forkserver died); a worker on a cluster
    node (``node``: its address and id) by its pid and the cause the cluster
    gave (``cause``: the process died, its node died, a memory monitor killed it).
    """

    code = "WORKER_CRASHED"

    def __init__(self, pid: int | None, exitcode: int | None, *, node: str | None = None, cause: str | None = None) -> None:
        if node is None:
            message = f"worker process {pid} {cause or describe_exit(exitcode)}"
        else:
            message = f"worker process {pid} on node {node} died: {cause or describe_exit(exitcode)}"
        super().__init__(message, pid=pid, exitcode=exitcode, node=node, cause=cause)
