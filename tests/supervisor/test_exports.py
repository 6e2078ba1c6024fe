"""The public surfaces of ``supervisor`` and ``worker`` are pinned: a change here is an API change."""

from __future__ import annotations

import importlib

import pytest

SUPERVISOR_ALL = [
    "SubagentError",
    "SupervisorConfig",
    "CancelledBeforeStartError",
    "InvalidRequestError",
    "RegistryError",
    "SubagentDepthError",
    "SupervisorClosedError",
    "WaitTimeoutError",
    "UnauthorizedError",
    "NotResumableError",
    "ActivationClosingError",
    "DrainingError",
    "TeardownFailedError",
    "DuplicateChildError",
    "NoParentError",
    "ParentUnavailableError",
    "AgentRef",
    "AncestorAuthority",
    "Capabilities",
    "ContinuableSpec",
    "InterruptResult",
    "Provider",
    "RunBudget",
    "SubagentRequest",
    "SubagentResult",
    "UserAuthority",
    "SubagentRun",
    "Supervisor",
    "ActivationInfo",
    "SupervisorStatistics",
]

WORKER_ALL = [
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

# Module-level ``__all__`` of the worker modules the supervisor and programs import directly.
WORKER_MODULES = {
    "subagents.worker.protocol": [
        "Budget", "TurnSpec", "RunTurn", "Cancel", "Withdraw", "Reply", "Shutdown", "Ready", "TurnOutcome", "TurnDone", "Started",
        "Withdrawn", "Rpc", "CancelRpc", "cancelled_before_start", "encode", "decode", "non_text_key", "BLOCKING_RPCS", "CHILD_STARTS",
    ],
    "subagents.worker.errors": ["BudgetExhaustedError", "ToolDeniedError", "ToolArgumentsError", "UnsendableArgumentError", "TurnGoneError", "ProgramLoadError", "ProtocolError", "WorkerCrashedError", "describe_exit"],
    "subagents.worker.programs.script": ["script", "parse_script", "iterations_per_ms"],
}


@pytest.mark.parametrize("package, expected", [("subagents.supervisor", SUPERVISOR_ALL), ("subagents.worker", WORKER_ALL)])
def test_package_all_is_pinned(package, expected):
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(expected)
    assert len(module.__all__) == len(set(module.__all__)), "a name is exported twice"


@pytest.mark.parametrize("package", ["supervisor", "worker", "store"])
def test_every_exported_name_exists(package):
    module = importlib.import_module(package)
    for name in module.__all__:
        assert getattr(module, name, None) is not None, f"{package}.{name} is listed but missing"


@pytest.mark.parametrize("module_name, expected", sorted(WORKER_MODULES.items()))
def test_worker_module_all_is_pinned(module_name, expected):
    module = importlib.import_module(module_name)
    assert sorted(module.__all__) == sorted(expected)


def test_errors_share_the_root():
    """Every error class exported by supervisor and worker is a SubagentError with its own code.

    ``TurnStopped`` is the exception: a control-flow signal inside a turn (like
    anyio's ``Cancelled``), never raised to a caller of the service.
    """
    import subagents.store.errors
    from subagents import store
    from subagents import supervisor
    from subagents import worker

    codes = {}
    for module in (supervisor, worker):
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, type) and issubclass(obj, BaseException) and obj is not worker.TurnStopped:
                assert issubclass(obj, store.errors.SubagentError), name
                codes[name] = obj.code
    assert codes["InvalidRequestError"] == "INVALID_REQUEST"
    assert codes["SubagentDepthError"] == "DEPTH_EXCEEDED"
    assert codes["CancelledBeforeStartError"] == "CANCELLED"
    assert codes["SupervisorClosedError"] == "SUPERVISOR_CLOSED"
    assert codes["WorkerCrashedError"] == "WORKER_CRASHED"
    assert codes["ToolDeniedError"] == "TOOL_DENIED"


def test_worker_does_not_import_supervisor():
    """The layering rule: worker never imports supervisor (checked in a clean interpreter)."""
    import subprocess
    import sys

    code = (
        "import sys, subagents.worker, subagents.worker.main, subagents.worker.turn, subagents.worker.programs; "
        "print(any(m.startswith('subagents.supervisor') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
