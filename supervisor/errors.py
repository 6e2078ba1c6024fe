"""Errors of the supervisor room: one class per cause, each message text written once, here.

    SubagentError (store/errors.py)
    ├── RegistryError             DUPLICATE_PROVIDER, NO_PROVIDER, UNSUPPORTED_CAPABILITY
    ├── InvalidRequestError       INVALID_REQUEST: a request field breaks its rule (also ValueError); LABEL_TOO_LARGE
    ├── SubagentDepthError        DEPTH_EXCEEDED: attempted_depth > max_depth
    ├── CancelledBeforeStartError CANCELLED: cancelled before the run was published
    ├── SupervisorClosedError     SUPERVISOR_CLOSED: the service is closing or closed
    ├── WaitTimeoutError          TIMEOUT: a wait for children or messages ran out (also TimeoutError)
    ├── NoParentError             NO_PARENT: the named parent session does not exist (also LookupError)
    ├── DuplicateChildError       DUPLICATE_CHILD: a caller-chosen child id is taken
    ├── UnauthorizedError         UNAUTHORIZED: the caller is not the agent allowed to do this (also PermissionError)
    ├── NotResumableError         NOT_RESUMABLE: a continuable child cannot be materialised from the store
    ├── ActivationClosingError    ACTIVATION_CLOSING: the activation concerned is being disposed
    ├── DrainingError             DRAINING: admission is closed (a drain, or the supervisor closing)
    ├── TeardownFailedError       ACTIVATION_TEARDOWN_FAILED: a drain did all it could; these children it could not tear down
    ├── ParentUnavailableError    PARENT_UNAVAILABLE: a report found no live direct parent
    ├── SetupError                ACTIVATION_SETUP_REVOKED, ACTIVATION_SETUP_RELEASE_FAILED
    ├── RpcError                  UNKNOWN_RPC, NO_RUN, TURN_GONE, RPC_FAILED: a turn's request to its supervisor failed
    ├── WorkerHandshakeError      WORKER_HANDSHAKE: a new worker did not announce itself
    ├── WorkerStartError          WORKER_START_FAILED: a worker could not be launched, exited or hung before Ready (also RuntimeError)
    ├── ThreadStartError          THREAD_START_FAILED: the host could not start a thread of its own (also RuntimeError)
    ├── RayUnavailableError       RAY_UNAVAILABLE: pool = "ray" without Ray, asyncio or a cluster
    ├── ConfigError               CONFIG_INVALID: a configuration (a layer, or a model built in code) is refused (also ValueError)
    └── UsageError                USAGE: the command line does not parse (an unknown option, a bad value; also ValueError)

The texts are part of the contract: programs and models read them, and
tests pin them. A class with several texts offers one named constructor per
text, so each is written once.
"""

from __future__ import annotations

import errno
from typing import Any

from subagents.store.errors import NO_DESCRIPTOR_LEFT, OUT_OF_DESCRIPTORS, SubagentError
from subagents.worker.errors import describe_exit
from subagents.worker.tools import SANDBOX_MODES

__all__ = [
    "RegistryError",
    "InvalidRequestError",
    "SubagentDepthError",
    "CancelledBeforeStartError",
    "SupervisorClosedError",
    "WaitTimeoutError",
    "NoParentError",
    "DuplicateChildError",
    "UnauthorizedError",
    "NotResumableError",
    "ActivationClosingError",
    "DrainingError",
    "TeardownFailedError",
    "ParentUnavailableError",
    "SetupError",
    "RpcError",
    "WorkerHandshakeError",
    "WorkerStartError",
    "RayUnavailableError",
    "ConfigError",
    "UsageError",
    "duplicate_provider",
    "no_provider",
    "unsupported_capability",
    "not_continuable",
    "program_missing",
]


class RegistryError(SubagentError):
    """Raised when the provider registry refuses a name or a capability."""


def duplicate_provider(name: str) -> RegistryError:
    return RegistryError(f'a subagent provider named "{name}" is already registered', code="DUPLICATE_PROVIDER", provider=name)


def no_provider(name: str, *, recorded: bool = True) -> RegistryError:
    """``recorded=False``: a child to resume whose descriptor names no program reference."""
    message = f'no subagent provider registered for "{name}"'
    if not recorded:
        message += (
            " (the child's descriptor records no program reference: a program carried by value, a Python"
            f' object, is recorded nowhere; register a provider named "{name}" to resume it)'
        )
    return RegistryError(message, code="NO_PROVIDER", provider=name)


def unsupported_capability(name: str, capability: str) -> RegistryError:
    return RegistryError(
        f'subagent provider "{name}" does not support the "{capability}" capability',
        code="UNSUPPORTED_CAPABILITY",
        provider=name,
        capability=capability,
    )


def not_continuable(name: str) -> RegistryError:
    return RegistryError(
        f'subagent provider "{name}" does not support continuable children (no prepareContinuable capability)',
        code="UNSUPPORTED_CAPABILITY",
        provider=name,
    )


def program_missing(child_id: str, provider: str) -> RegistryError:
    """A resident child's provider is gone and no built-in program has its name."""
    return RegistryError(f'subagent "{child_id}" needs provider "{provider}" to run its program', code="NO_PROVIDER", provider=provider)


# the longest cancel reason: a word or a sentence (it is echoed in every diagnostic of the cancelled turn)
MAX_REASON_CHARS = 1024


class InvalidRequestError(SubagentError, ValueError):
    """Raised when a request field breaks its rule; nothing was created."""

    code = "INVALID_REQUEST"

    @classmethod
    def not_a_root(cls, session_id: str, parent: str) -> "InvalidRequestError":
        """``open_root(id=...)`` named a session that has a parent."""
        return cls(f'session "{session_id}" is not a root: it is a child of "{parent}"', session_id=session_id, parent=parent)

    @classmethod
    def other_label(cls, session_id: str, stored: str | None, asked: str) -> "InvalidRequestError":
        """``open_root(id=..., label=...)`` with a label that is not the root's own."""
        shown = f'"{stored}"' if stored is not None else "no label"
        return cls(f'root "{session_id}" has {shown}, not "{asked}"', session_id=session_id, label=stored)

    @classmethod
    def label_too_large(cls, label: str, record_bytes: int, limit: int) -> "InvalidRequestError":
        """A label its record (descriptor, header) cannot hold: named for the label, as a message is ``MESSAGE_TOO_LARGE``."""
        size = len(label.encode("utf-8"))
        return cls(f"label of {size} bytes is too large for the store's record size limit of {limit} bytes (max_record_bytes)",
                   code="LABEL_TOO_LARGE", field="label", size=size, record_size=record_bytes, limit=limit)

    @classmethod
    def require(cls, value: Any, kinds: type | tuple[type, ...], name: str) -> None:
        """An argument of the wrong type (``None`` for a request, a string for a query) is this error at
        the public boundary, not an ``AttributeError`` from deep inside."""
        if not isinstance(value, kinds):
            wanted = " or ".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
            raise cls(f"{name} must be {wanted.replace('NoneType', 'None')}, not {type(value).__name__}", field=name)

    @classmethod
    def require_seconds(cls, value: Any, name: str) -> None:
        """``None`` or a finite, non-negative number of seconds."""
        from subagents.store.records import finite_number  # pydantic's models: not loaded for the CLI's UsageError
        if value is not None and (not finite_number(value) or value < 0):
            raise cls(f"{name} must be None or a finite number of seconds >= 0, not {value!r}", field=name)

    @classmethod
    def require_reason(cls, value: Any, name: str = "reason") -> None:
        """A cancel's reason: text of 1 to ``MAX_REASON_CHARS`` characters that UTF-8 can encode. It
        goes into the turn's records (``turn/end``'s ``cause``, its diagnostic), which a reason that is
        no text, or too large for a record, would break after the run was already marked cancelled."""
        cls.require(value, str, name)
        if not 0 < len(value) <= MAX_REASON_CHARS:
            raise cls(f"{name} must be 1 to {MAX_REASON_CHARS} characters, not {len(value)}", field=name)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise cls(f"{name} must be text UTF-8 can encode ({exc.reason} at {exc.start})", field=name) from None

    @classmethod
    def require_sandbox(cls, value: Any) -> None:
        """``None`` or one of ``SANDBOX_MODES``: only the exact ``read-only`` forbids writers, so a misspelt
        mode (``readonly``) accepted here would quietly let a child write."""
        cls.require(value, (str, type(None)), "sandbox")
        if value is not None and value not in SANDBOX_MODES:
            raise cls(f'unknown sandbox mode "{value}" (known: {", ".join(SANDBOX_MODES)})', field="sandbox", mode=value)

    @classmethod
    def wrong_fields(cls, model: str, problems: list[tuple[str, str]]) -> "InvalidRequestError":
        """A request model refused its fields' types: ``(field path, what is wrong)`` each.

        ``field`` is the first path; ``problems`` keeps each as ``"path: what"``
        (so a model holding this one can prefix its own path).
        """
        lines = [f"{path}: {what}" for path, what in problems]
        return cls(f"invalid {model}: " + "; ".join(lines), field=problems[0][0], problems=lines)


class SubagentDepthError(SubagentError):
    """Raised when a child would be deeper than the request's ``max_depth``, or the supervisor's
    (``host``: its ``max_depth`` setting, which the text names, since the request gave none so low)."""

    code = "DEPTH_EXCEEDED"

    def __init__(self, attempted_depth: int, max_depth: int, *, host: bool = False) -> None:
        super().__init__(
            f"subagent depth {attempted_depth} exceeds maxDepth {max_depth}" + (" (this supervisor's max_depth setting)" if host else ""),
            attempted_depth=attempted_depth,
            max_depth=max_depth,
        )


class CancelledBeforeStartError(SubagentError):
    """Raised when a start was cancelled before the run was published; nothing remains."""

    code = "CANCELLED"

    @classmethod
    def before_creation(cls) -> "CancelledBeforeStartError":
        return cls("the start was cancelled before the child was created")

    @classmethod
    def before_publication(cls) -> "CancelledBeforeStartError":
        return cls("the start was cancelled before the child was published")


class SupervisorClosedError(SubagentError):
    """Raised for operations on a Supervisor that is closing or closed."""

    code = "SUPERVISOR_CLOSED"

    def __init__(self) -> None:
        super().__init__("the supervisor is closed")


class WaitTimeoutError(SubagentError, TimeoutError):
    """Raised when a wait (for a message, for children to settle) ran past its deadline."""

    code = "TIMEOUT"


class NoParentError(SubagentError, LookupError):
    """Raised when a start names a parent session that neither lives here nor exists in the store."""

    code = "NO_PARENT"

    def __init__(self, parent: str) -> None:
        super().__init__(f'parent session "{parent}" does not exist', parent=parent)


class DuplicateChildError(SubagentError):
    """Raised when a continuable start reserves a child id that a live agent or a stored session holds."""

    code = "DUPLICATE_CHILD"

    def __init__(self, child_id: str) -> None:
        super().__init__(f'subagent "{child_id}" already exists', child_id=child_id)


class UnauthorizedError(SubagentError, PermissionError):
    """Raised when the caller is not the agent the operation requires (exact live parent, ancestor, the child itself)."""

    code = "UNAUTHORIZED"

    @classmethod
    def not_live_parent(cls, child_id: str) -> "UnauthorizedError":
        """Delivery (start, followup) named a parent that is not live in this supervisor."""
        return cls(f'subagent "{child_id}" delivery requires the exact live parent agent', child_id=child_id)

    @classmethod
    def other_parent(cls, child_id: str) -> "UnauthorizedError":
        """The child's header names another parent session."""
        return cls(f'subagent "{child_id}" belongs to another parent session', child_id=child_id)

    @classmethod
    def cannot_report(cls, agent_id: str) -> "UnauthorizedError":
        return cls(f'agent "{agent_id}" is not a live continuable subagent and cannot report', agent_id=agent_id)

    @classmethod
    def not_live_ancestor(cls, target_id: str) -> "UnauthorizedError":
        return cls(f'interrupting "{target_id}" requires the exact live ancestor agent', target_id=target_id)

    @classmethod
    def self_interrupt(cls, target_id: str) -> "UnauthorizedError":
        return cls(f'agent "{target_id}" cannot interrupt itself', target_id=target_id)

    @classmethod
    def not_descendant(cls, target_id: str, caller: str) -> "UnauthorizedError":
        return cls(f'subagent "{target_id}" is not a live descendant of agent "{caller}"', target_id=target_id, caller=caller)

    @classmethod
    def teardown_needs_parent(cls) -> "UnauthorizedError":
        return cls("selected child teardown requires the exact live parent agent")

    @classmethod
    def not_direct_child(cls, child_id: str, parent: str) -> "UnauthorizedError":
        return cls(f'subagent "{child_id}" is not a direct child of agent "{parent}"', child_id=child_id, parent=parent)

    @classmethod
    def not_own_root(cls, root_id: str) -> "UnauthorizedError":
        return cls(f'agent "{root_id}" is not a root opened by this supervisor', root_id=root_id)


class NotResumableError(SubagentError):
    """Raised when a continuable child cannot be materialised from the store (unreadable, held elsewhere, no descriptor)."""

    code = "NOT_RESUMABLE"

    @classmethod
    def unavailable(cls, child_id: str, detail: str | None = None) -> "NotResumableError":
        suffix = f": {detail}" if detail else ""
        return cls(f'subagent "{child_id}" is unavailable{suffix}', child_id=child_id)

    @classmethod
    def held_elsewhere(cls, child_id: str) -> "NotResumableError":
        return cls.unavailable(child_id, "it is active in another supervisor")

    @classmethod
    def no_state(cls, child_id: str) -> "NotResumableError":
        """Its log holds no continuable descriptor: retrying cannot help."""
        return cls(
            f'subagent "{child_id}" has no supported continuation state and cannot be resumed; do not retry send_message with this id',
            child_id=child_id,
        )


class ActivationClosingError(SubagentError):
    """Raised when the activation an operation needs (the child's, or its parent's) is being disposed."""

    code = "ACTIVATION_CLOSING"

    @classmethod
    def parent_disposing(cls, parent_id: str) -> "ActivationClosingError":
        return cls(f'subagent parent "{parent_id}" is being disposed; the child was not established', parent=parent_id)

    @classmethod
    def message_refused(cls, child_id: str) -> "ActivationClosingError":
        return cls(f'subagent "{child_id}" activation is being disposed; the message was not accepted', child_id=child_id)

    @classmethod
    def report_refused(cls, child_id: str) -> "ActivationClosingError":
        return cls(f'subagent "{child_id}" activation is being disposed; the report was not delivered', child_id=child_id)


class DrainingError(SubagentError):
    """Raised when admission is closed: below a parent being drained, or everywhere while the supervisor closes."""

    code = "DRAINING"

    def __init__(self, parent: str | None = None) -> None:
        if parent is None:
            super().__init__("continuable subagents are draining; the operation was not admitted")
        else:
            super().__init__(f'continuable subagents below parent "{parent}" are draining; the operation was not admitted', parent=parent)


class TeardownFailedError(SubagentError):
    """Raised by a drain after every branch settled, for the children it could not tear down (their files
    do not read, or refused the drain): the rest was torn down. ``failed``: child id → why; ``reached``:
    the ids ``drain_remote`` reached (asked, or drained here), which it would have returned."""

    code = "ACTIVATION_TEARDOWN_FAILED"

    def __init__(self, scope: str, failed: dict[str, str], *, reached: list[str] | None = None) -> None:
        causes = "; ".join(f'subagent "{child_id}" activation teardown failed: {why}' for child_id, why in failed.items())
        super().__init__(f"continuable subagent teardown failed for {len(failed)} {scope} activation(s): {causes}",
                         failed=dict(failed), reached=list(reached or []))


class ParentUnavailableError(SubagentError):
    """Raised when a report finds its child's direct parent not live."""

    code = "PARENT_UNAVAILABLE"

    def __init__(self) -> None:
        super().__init__("direct parent is not live; report was not delivered")


class SetupError(SubagentError):
    """Raised when a continuable setup contribution was revoked mid-build or its disposers failed."""

    @classmethod
    def revoked(cls) -> "SetupError":
        return cls(
            "a continuable-subagent setup contribution was revoked while this child was being built; the child was not established",
            code="ACTIVATION_SETUP_REVOKED",
        )

    @classmethod
    def release_failed(cls, what: str, failures: list[BaseException]) -> "SetupError":
        return cls(
            f"continuable-subagent setup {what} failed to release {len(failures)} installation(s): "
            + "; ".join(f"{type(e).__name__}: {e}" for e in failures),
            code="ACTIVATION_SETUP_RELEASE_FAILED",
        )


class RpcError(SubagentError):
    """Raised back into a turn when its request to the supervisor cannot be served."""

    @classmethod
    def unknown(cls, method: str) -> "RpcError":
        return cls(f"unknown rpc {method!r}", code="UNKNOWN_RPC", method=method)

    @classmethod
    def no_run(cls, run_id: str) -> "RpcError":
        return cls(f'no background subagent "{run_id}" was started by this turn', code="NO_RUN", run_id=run_id)

    @classmethod
    def turn_gone(cls) -> "RpcError":
        return cls("the calling turn is gone", code="TURN_GONE")

    @classmethod
    def failed(cls, exc: BaseException) -> "RpcError":
        """An unexpected failure serving the request (logged with its traceback where it happened)."""
        return cls(f"{type(exc).__name__}: {exc}", code="RPC_FAILED")


class WorkerHandshakeError(SubagentError):
    """Raised when a new worker's first message is not ``Ready``."""

    code = "WORKER_HANDSHAKE"

    def __init__(self, pid: int | None) -> None:
        super().__init__(f"worker {pid} did not announce itself", pid=pid)


class WorkerStartError(SubagentError, RuntimeError):
    """Raised by the pool's start when a worker process never became ready: nothing can run on this host.

    The process could not be launched (the forkserver died, the executable
    failed), it exited before sending ``Ready`` (a broken interpreter or
    environment: its own output on stderr says why), or it sent nothing within
    ``worker_ready_timeout_s`` (it was killed). ``pid`` and ``exitcode`` name
    the worker where there was one.
    """

    code = "WORKER_START_FAILED"

    @classmethod
    def not_launched(cls, start_method: str, exc: BaseException) -> "WorkerStartError":
        """``exc`` stopped the launch; one that says the host had no descriptor or process left says which limit to raise."""
        why = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, OSError) and exc.errno in OUT_OF_DESCRIPTORS:
            why += f" ({NO_DESCRIPTOR_LEFT})"
        elif isinstance(exc, OSError) and exc.errno == errno.EAGAIN:
            why += " (no process could be made: the user's process limit, ulimit -u, or the system's)"
        return cls(f"a worker process could not be started (start method {start_method}): {why}", pid=None, exitcode=None)

    @classmethod
    def exited(cls, pid: int | None, exitcode: int | None) -> "WorkerStartError":
        return cls(f"worker process {pid} {describe_exit(exitcode)} before it was ready", pid=pid, exitcode=exitcode)

    @classmethod
    def not_ready(cls, pid: int | None, timeout_s: float) -> "WorkerStartError":
        return cls(f"worker process {pid} was not ready within {timeout_s:g}s (worker_ready_timeout_s) and was killed",
                   pid=pid, exitcode=None)


class ThreadStartError(SubagentError, RuntimeError):
    """Raised when the supervisor could not start one of its own threads (a store thread, started on demand):
    the user's process limit (``ulimit -u``) or the memory for its stack ran out. Nothing was done; the same
    call made once the limit is back starts the thread then."""

    code = "THREAD_START_FAILED"

    def __init__(self, what: str, exc: BaseException) -> None:
        super().__init__(f"a thread for {what} could not be started: {exc} (the user's process limit, ulimit -u, "
                         "or the memory for its stack)", what=what)

    @classmethod
    def of(cls, exc: BaseException) -> "ThreadStartError | None":
        """``exc`` as this error when it says a thread could not be started: this error, or the interpreter's
        own ``RuntimeError`` (a worker thread ``anyio.to_thread`` could not make for a store call); else None."""
        if isinstance(exc, ThreadStartError):
            return exc
        if type(exc) is RuntimeError and str(exc) == "can't start new thread":
            return cls("a store call", exc)
        return None


class RayUnavailableError(SubagentError, RuntimeError):
    """Raised by ``Supervisor.open`` with ``pool = "ray"`` when Ray cannot serve this host.

    Ray is not installed (``pip install 'subagents[ray]'``), the event loop is
    not asyncio (Ray's object refs are asyncio awaitables), or the cluster
    cannot be joined. Nothing was started.
    """

    code = "RAY_UNAVAILABLE"


class ConfigError(SubagentError, ValueError):
    """Raised when a configuration layer is unreadable, names an unknown key or holds a bad value, and
    when a configuration model built in code (``SupervisorConfig(...)``) is given one."""

    code = "CONFIG_INVALID"

    @classmethod
    def refused(cls, path: tuple[str, ...], kind: str, problem: str, source: str) -> "ConfigError":
        """The first value ``source`` (a layer, or the model's name) gives that its model refuses: at ``path``
        (``("providers", "0", "model")`` reads ``providers[0].model``), of pydantic's error ``kind``."""
        key = "".join(f"[{part}]" if part.isdigit() else f".{part}" for part in path).lstrip(".") or "(top level)"
        fields = {"key": key, "source": source, "path": list(path), "kind": kind, "problem": problem}
        if kind == "extra_forbidden":
            return cls(f'unknown key "{key}" in {source}', **fields)
        return cls(f'invalid value for "{key}" in {source}: {problem}', **fields)


class UsageError(SubagentError, ValueError):
    """Raised by the CLI's argument parser for a command line it cannot parse; the CLI exits 2."""

    code = "USAGE"
