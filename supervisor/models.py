"""The public request and result models of the service (pydantic at the boundary).

The models a caller builds (``SubagentRequest``, ``ContinuableSpec``,
``RunBudget``, and ``Provider`` with its ``Capabilities``) refuse a field of
the wrong type, an unknown sandbox mode or a malformed program reference
with ``InvalidRequestError`` (``INVALID_REQUEST``), as the start's own checks
(``validation.py``) refuse a bad value: a caller catches one ``SubagentError`` with a code, never
pydantic's ``ValidationError``, and nothing has been created yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, field_validator

from subagents.worker.program_names import reference_problem

from .errors import InvalidRequestError

__all__ = [
    "Capabilities",
    "Provider",
    "RunBudget",
    "AgentRef",
    "SubagentRequest",
    "SubagentResult",
    "StopReason",
    "ContinuableSpec",
    "UserAuthority",
    "AncestorAuthority",
    "InterruptOutcome",
    "InterruptResult",
]

StopReason = Literal["completed", "aborted", "error", "max-tokens", "refusal", "budget-exhausted"]


def well_formed_program(program: Any) -> Any:
    """A program reference's shape, by the worker loader's own rule (``reference_problem``; the module is
    imported only by a worker), so a malformed one is refused before any child is made: by ``Provider``,
    and by a configured ``[[providers]]`` table (``config_loader``). A callable passes as it is."""
    problem = reference_problem(program) if isinstance(program, str) else None
    if problem is not None:
        raise ValueError(problem)
    return program


MAX_PROVIDER_NAME = 200


def well_formed_provider_name(name: str) -> str:
    """A provider's name names its children in every listing, ``subagents run NAME`` and every error: printable
    text (no newline, NUL or escape), not blank nor padded with spaces, of a length a line can show."""
    if not name.isprintable() or name != name.strip() or len(name) > MAX_PROVIDER_NAME:
        raise ValueError(f"a provider's name is printable text of at most {MAX_PROVIDER_NAME} characters, with no space at either end")
    return name


class _Request(BaseModel):
    """A model a caller builds (a request, a provider): its type errors are ``InvalidRequestError``."""

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise InvalidRequestError.wrong_fields(type(self).__name__, field_problems(exc)) from None


class Capabilities(_Request):
    """What a provider supports for one-shot starts (all off by default: a provider opts in to each)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    output_schema: bool = False
    depth_limit: bool = False
    tool_filter: bool = False
    persona: bool = False
    sandbox_mode: bool = False
    run_budget: bool = False

    @classmethod
    def all(cls) -> "Capabilities":
        return cls(output_schema=True, depth_limit=True, tool_filter=True, persona=True, sandbox_mode=True, run_budget=True)


class Provider(_Request):
    """A named way to run children: which program, what it supports."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    name: str = Field(min_length=1)  # "" was registered, and named in no listing, command or error readably
    program: str | Callable[..., Any]
    capabilities: Capabilities = Capabilities()
    inherits_parent_context: bool = False
    continuable: bool = False

    _program = field_validator("program")(well_formed_program)
    _name = field_validator("name")(well_formed_provider_name)


def _known_sandbox(value: str | None) -> str | None:
    """A start's ``sandbox`` is a mode the tools know (``INVALID_REQUEST`` otherwise), whoever builds the
    request: the host, or a program's ``ctx.spawn``/``ctx.start_continuable`` (the supervisor builds it)."""
    InvalidRequestError.require_sandbox(value)
    return value


class RunBudget(_Request):
    """Strict: a lax model turned ``True`` into 1 step and ``"5"`` or ``5.0`` into 5, and started the child."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_steps: int | None = None
    timeout_ms: int | None = None


@dataclass(frozen=True)
class AgentRef:
    """A live agent of this supervisor (a root opened by the host). An id that is no text is
    ``INVALID_REQUEST`` as the reference is built: ``AgentRef(["x"])`` was taken, then failed as a
    bare ``TypeError: unhashable type`` from a table lookup inside."""

    id: str
    label: str | None = None

    def __post_init__(self) -> None:
        InvalidRequestError.require(self.id, str, "id")


def ref_id(agent: Any, name: str = "parent") -> str:
    """The id an ``AgentRef`` or a string names. Anything else is ``INVALID_REQUEST`` here, at the public
    boundary (a list or a dict was a bare ``TypeError: unhashable type`` from a table lookup inside)."""
    if isinstance(agent, AgentRef):
        return agent.id
    InvalidRequestError.require(agent, (AgentRef, str), name)
    return agent


class SubagentRequest(_Request):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    parent: AgentRef | str
    prompt: Any
    # text, never coerced to it: a label of bytes was decoded and taken, silently (StrictStr, here and below)
    label: StrictStr | None = None
    output_schema: dict[str, Any] | None = None
    max_depth: Any = None
    tool_filter: dict[str, list[str]] | None = None
    persona: StrictStr | None = None
    sandbox: StrictStr | None = None
    model: StrictStr | None = None
    budget: RunBudget | None = None

    _sandbox = field_validator("sandbox")(_known_sandbox)

    @property
    def parent_id(self) -> str:
        return ref_id(self.parent)


class SubagentResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    output: str = ""
    structured: Any = None
    stop_reason: StopReason
    diagnostic: str | None = None


class ContinuableSpec(_Request):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    parent: AgentRef | str
    provider: StrictStr
    prompt: Any
    label: StrictStr
    child_id: StrictStr | None = None
    max_depth: Any = None
    tool_filter: dict[str, list[str]] | None = None
    persona: StrictStr | None = None
    sandbox: StrictStr | None = None
    agent_provider: StrictStr | None = None
    model: StrictStr | None = None
    budget: RunBudget | None = None

    _sandbox = field_validator("sandbox")(_known_sandbox)

    @property
    def parent_id(self) -> str:
        return ref_id(self.parent)


@dataclass(frozen=True)
class UserAuthority:
    """The host user's authority over the children of ``parent_session`` (the session id they were started under).

    An id that is no text is ``INVALID_REQUEST`` as the authority is built: ``UserAuthority(None)`` names
    no caller at all, and was taken as one (an interrupt answered, or ``UNAUTHORIZED``: a denied caller).
    """

    parent_session: str
    kind: Literal["user"] = "user"

    def __post_init__(self) -> None:
        InvalidRequestError.require(self.parent_session, str, "parent_session")


@dataclass(frozen=True)
class AncestorAuthority:
    """The authority of a live ancestor agent (its ``AgentRef`` or id); anything else is ``INVALID_REQUEST``, as for ``UserAuthority``."""

    agent: AgentRef | str
    kind: Literal["ancestor"] = "ancestor"

    def __post_init__(self) -> None:
        InvalidRequestError.require(self.agent, (AgentRef, str), "agent")

    @property
    def agent_id(self) -> str:
        return self.agent.id if isinstance(self.agent, AgentRef) else self.agent


InterruptOutcome = Literal["cancelled", "requested", "no_turn_running"]


class InterruptResult(BaseModel):
    """What ``Supervisor.interrupt`` did, so a caller never reads success into a no-op.

    ``cancelled``: a running turn was told to stop — here (``host`` is None) or
    by the supervisor ``host`` that holds the child, which confirmed it within
    the wait (``stop_reason`` is how the turn ended). ``requested``: a durable
    request went to the live supervisor ``host``, which had not confirmed it
    when the wait ended. ``no_turn_running``: nothing to stop (settled, idle,
    no live holder, no such session, or the turn ended on its own first);
    ``detail`` says which. ``turn`` is the turn's number in the child's log (1:
    its first) and ``message_id`` the message it runs, when the log shows it.
    """

    model_config = ConfigDict(frozen=True)

    outcome: InterruptOutcome
    child_id: str
    turn: int | None = None
    message_id: str | None = None
    host: str | None = None  # the owner id of the other supervisor that holds the child
    host_pid: int | None = None
    stop_reason: str | None = None
    detail: str = ""


def field_problems(exc: ValidationError) -> list[tuple[str, str]]:
    """Each refused field as ``(path, what is wrong)``; a nested request model (pydantic builds it through
    ``_Request.__init__``) contributes its own fields under its path, not one wrapped "Value error"."""
    problems: list[tuple[str, str]] = []
    for error in exc.errors():
        path = ".".join(str(part) for part in error["loc"])
        inner = error.get("ctx", {}).get("error")
        if isinstance(inner, InvalidRequestError) and isinstance(getattr(inner, "problems", None), list):
            for line in inner.problems:
                field, _, what = line.partition(": ")
                problems.append((f"{path}.{field}" if path else field, what))
        else:  # a validator's own error (a ValueError) without pydantic's "Value error, " before its text
            problems.append((path, error["msg"].removeprefix("Value error, ")))
    return problems

