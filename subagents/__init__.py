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

from typing import TYPE_CHECKING

from .exports import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, {".supervisor": __all__}, __all__)
