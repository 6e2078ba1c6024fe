"""The host side of subagents: the ``Supervisor`` service and its public models.

Layout: ``service`` (the façade), ``runtime`` (what the collaborators
share), ``registry`` (providers), ``backend`` (the ``Pool`` protocol) and
``pool`` (local worker processes), ``oneshot`` (one-shot runs),
``continuable/`` (continuable children: activations, delivery, teardown),
``validation`` (start requests), ``rpc`` (what turns ask of the
supervisor), ``lease_keeper`` (owner heartbeat), ``events`` (lifecycle
events), ``config``, ``models``, ``errors``, and ``cli/`` (the command line,
the only package that prints).

The names resolve on first use (PEP 562), as ``subagents``' own do: the CLI
lives in this package, and loading the service here would cost every
``subagents --version`` or ``subagents ls`` the supervisor's whole runtime
(anyio, multiprocess, the worker, the programs' clients).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from subagents.exports import lazy_exports

if TYPE_CHECKING:
    from subagents.store.errors import SubagentError
    from .config import SupervisorConfig
    from .errors import (
        ActivationClosingError,
        CancelledBeforeStartError,
        DrainingError,
        TeardownFailedError,
        DuplicateChildError,
        InvalidRequestError,
        NoParentError,
        NotResumableError,
        ParentUnavailableError,
        RegistryError,
        SubagentDepthError,
        SupervisorClosedError,
        UnauthorizedError,
        WaitTimeoutError,
    )
    from .models import (
        AgentRef,
        AncestorAuthority,
        Capabilities,
        ContinuableSpec,
        InterruptResult,
        Provider,
        RunBudget,
        SubagentRequest,
        SubagentResult,
        UserAuthority,
    )
    from .oneshot import SubagentRun
    from .service import Supervisor, SupervisorStatistics
    from .setup import ActivationInfo

# module -> the names it gives this package
_EXPORTS: dict[str, tuple[str, ...]] = {
    "subagents.store.errors": ("SubagentError",),
    ".config": ("SupervisorConfig",),
    ".errors": (
        "ActivationClosingError", "CancelledBeforeStartError", "DrainingError", "TeardownFailedError",
        "DuplicateChildError", "InvalidRequestError", "NoParentError", "NotResumableError",
        "ParentUnavailableError", "RegistryError", "SubagentDepthError", "SupervisorClosedError",
        "UnauthorizedError", "WaitTimeoutError",
    ),
    ".models": (
        "AgentRef", "AncestorAuthority", "Capabilities", "ContinuableSpec", "InterruptResult", "Provider",
        "RunBudget", "SubagentRequest", "SubagentResult", "UserAuthority",
    ),
    ".oneshot": ("SubagentRun",),
    ".service": ("Supervisor", "SupervisorStatistics"),
    ".setup": ("ActivationInfo",),
}

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
