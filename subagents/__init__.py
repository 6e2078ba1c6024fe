"""subagents: child agents in worker processes over a durable, shared store.

General layout: three rooms install under this one name.
``subagents.store`` is the on-disk format (sessions, leases, mailboxes, the
index; it imports neither other room), ``subagents.worker`` is the child
runtime inside a worker process (it never imports the supervisor), and
``subagents.supervisor`` is the host side: the ``Supervisor`` service and the
``subagents`` CLI. In the repository the rooms are the top-level folders
``store/``, ``worker/`` and ``supervisor/``; ``pyproject.toml`` maps them here.

This module re-exports the public API of the supervisor. The names resolve
on first use (PEP 562), so a worker process that imports
``subagents.worker`` never loads the host side through this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
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

if TYPE_CHECKING:
    from .supervisor import (
        ActivationInfo,
        AgentRef,
        AncestorAuthority,
        CancelledBeforeStartError,
        Capabilities,
        ContinuableSpec,
        InterruptResult,
        InvalidRequestError,
        Provider,
        RegistryError,
        RunBudget,
        SubagentDepthError,
        SubagentError,
        SubagentRequest,
        SubagentResult,
        SubagentRun,
        Supervisor,
        SupervisorClosedError,
        SupervisorConfig,
        SupervisorStatistics,
        UserAuthority,
        WaitTimeoutError,
        UnauthorizedError,
        NotResumableError,
        ActivationClosingError,
        DrainingError,
        TeardownFailedError,
        DuplicateChildError,
        NoParentError,
        ParentUnavailableError,
    )


def __getattr__(name: str) -> Any:
    if name in __all__:
        value = getattr(importlib.import_module(".supervisor", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
