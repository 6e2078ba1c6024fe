"""Errors of the supervisor room, each with the reference's stable code.

    SubagentError (store/errors.py)
    ├── RegistryError            DUPLICATE_PROVIDER, NO_PROVIDER, UNSUPPORTED_CAPABILITY
    ├── InvalidRequestError      INVALID_REQUEST: a request field breaks its rule (also ValueError)
    ├── SubagentDepthError       DEPTH_EXCEEDED: attempted_depth > max_depth
    ├── CancelledBeforeStartError CANCELLED: cancelled before the run was published
    ├── SupervisorClosedError    SUPERVISOR_CLOSED: the service is closing or closed
    └── WaitTimeoutError         TIMEOUT: a wait for children or messages ran out (also TimeoutError)

Messages are the reference's texts (REFERENCE.md §1.6), which models read.
"""

from __future__ import annotations

from subagents.store.errors import SubagentError

__all__ = [
    "RegistryError",
    "InvalidRequestError",
    "SubagentDepthError",
    "CancelledBeforeStartError",
    "SupervisorClosedError",
    "WaitTimeoutError",
    "duplicate_provider",
    "no_provider",
    "unsupported_capability",
]


class RegistryError(SubagentError):
    """Raised when the provider registry refuses a name or a capability."""


def duplicate_provider(name: str) -> RegistryError:
    return RegistryError(f'a subagent provider named "{name}" is already registered', code="DUPLICATE_PROVIDER", provider=name)


def no_provider(name: str) -> RegistryError:
    return RegistryError(f'no subagent provider registered for "{name}"', code="NO_PROVIDER", provider=name)


def unsupported_capability(name: str, capability: str) -> RegistryError:
    return RegistryError(
        f'subagent provider "{name}" does not support the "{capability}" capability',
        code="UNSUPPORTED_CAPABILITY",
        provider=name,
        capability=capability,
    )


class InvalidRequestError(SubagentError, ValueError):
    """Raised when a request field breaks its rule; nothing was created."""

    code = "INVALID_REQUEST"


class SubagentDepthError(SubagentError):
    """Raised when a child would be deeper than the request's ``max_depth``."""

    code = "DEPTH_EXCEEDED"

    def __init__(self, attempted_depth: int, max_depth: int) -> None:
        super().__init__(
            f"subagent depth {attempted_depth} exceeds maxDepth {max_depth}",
            attempted_depth=attempted_depth,
            max_depth=max_depth,
        )


class CancelledBeforeStartError(SubagentError):
    """Raised when a start was cancelled before the run was published; nothing remains."""

    code = "CANCELLED"


class SupervisorClosedError(SubagentError):
    """Raised for operations on a Supervisor that is closing or closed."""

    code = "SUPERVISOR_CLOSED"


class WaitTimeoutError(SubagentError, TimeoutError):
    """Raised when a wait (for a message, for children to settle) ran past its deadline."""

    code = "TIMEOUT"
