"""The host side of subagents: the ``Supervisor`` service and its public models.

Layout: ``service`` (the façade), ``runtime`` (what the collaborators
share), ``registry`` (providers), ``backend`` (the ``Pool`` protocol) and
``pool`` (local worker processes), ``oneshot`` (one-shot runs),
``continuable/`` (continuable children: activations, delivery, teardown),
``validation`` (start requests), ``rpc`` (what turns ask of the
supervisor), ``lease_keeper`` (owner heartbeat), ``events`` (lifecycle
events), ``config``, ``models``, ``errors``, and ``cli/`` (the command line,
the only package that prints).
"""

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
