"""Request validation shared by one-shot and continuable starts.

Everything here runs before the first byte of a child is written, so a
refused request leaves no trace. ``request_fields`` checks the fields both
kinds of start carry (``max_depth``, ``budget``, ``tool_filter``, and a
one-shot's ``output_schema``); ``place_child`` takes the policy snapshot of
the parent (its depth and sandbox mode, read before the caller's first
await) and checks the child's depth; ``delegation_events`` is the prefix
every child's log starts with. Called by ``oneshot.py`` and
``continuable/materialization.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgpack
from pydantic import ValidationError

from subagents.store import Store, ToolFilter, read_header
from subagents.store.descriptor import ContinuableDescriptor, OneShotDescriptor
from subagents.store.errors import SessionNotFoundError
from subagents.store.events import widest_event
from subagents.worker.protocol import Budget
from subagents.worker.tools import SANDBOX_MODES

from .agents import LiveAgents
from .errors import InvalidRequestError, NoParentError, SubagentDepthError
from .models import RunBudget, field_problems

__all__ = [
    "MAX_TIMEOUT_MS", "RequestFields", "Placement", "request_fields", "place_child", "prompt_text", "check_label_fits", "delegation_events",
]

# the largest timer a JavaScript host accepts (2**31 - 1 ms); kept so budgets mean the same everywhere
MAX_TIMEOUT_MS = 2_147_483_647
# the largest integer every reader of a record holds exactly (a JSON number read as a double); larger
# counts also fail to travel to a worker (msgpack stops at 2**64)
MAX_SAFE_INTEGER = 2**53 - 1


@dataclass(frozen=True)
class RequestFields:
    """The checked fields of a start request."""

    max_depth: int | None
    budget: Budget
    tool_filter: ToolFilter | None


@dataclass(frozen=True)
class Placement:
    """Where a new child goes: its parent, its depth, and the sandbox mode it inherits or was given."""

    parent_id: str
    depth: int
    sandbox: str | None
    # a parent that is no live agent here (a root we opened, a one-shot we run): a resident continuable
    # child, or a session known only from the store, which ``gc`` may be collecting (``oneshot.py``)
    stored: bool = False


def _max_depth(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SAFE_INTEGER:
        raise InvalidRequestError("subagent maxDepth must be a non-negative safe integer")
    return value


def _budget(budget: RunBudget | None) -> Budget:
    if budget is None:
        return Budget()
    for name in ("max_steps", "timeout_ms"):
        value = getattr(budget, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_SAFE_INTEGER):
            raise InvalidRequestError(f"budget {name} must be a positive safe integer", field=name)
    if budget.timeout_ms is not None and budget.timeout_ms > MAX_TIMEOUT_MS:
        raise InvalidRequestError(f"budget timeout_ms must be at most {MAX_TIMEOUT_MS}", field="timeout_ms")
    return Budget(max_steps=budget.max_steps, timeout_ms=budget.timeout_ms)


def _output_schema(schema: Any) -> None:
    if schema is None:
        return
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise InvalidRequestError("output_schema must be an object-rooted JSON schema ({\"type\": \"object\", ...})")
    try:  # the schema travels to the worker and into its records as JSON-shaped msgpack: checked before the child is made
        json.dumps(schema, allow_nan=False)
        msgpack.packb(schema)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidRequestError(f"output_schema must be a JSON document ({type(exc).__name__}: {exc})") from None
    from subagents.worker.output_schema import schema_problem  # jsonschema loads only for a request that has a schema

    problem = schema_problem(schema)
    if problem is not None:
        raise InvalidRequestError(f"output_schema cannot be applied: {problem}", field="output_schema")


def _tool_filter(raw: Any) -> ToolFilter | None:
    if raw is None:
        return None
    try:
        return ToolFilter.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{path}: {what}" if path else what for path, what in field_problems(exc))
        raise InvalidRequestError(f"tool_filter is invalid: {problems}", field="tool_filter") from None


def _encodable(name: str, value: Any) -> None:
    """Text a message to a worker and a record can hold: a lone surrogate (``"\\ud800"``, which
    Python's text allows and UTF-8 does not) failed only as the turn was encoded for its worker,
    after the child was made."""
    texts = value if isinstance(value, list) else [value]
    for text in texts:
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise InvalidRequestError(f"{name} must be text UTF-8 can hold (a lone surrogate at index {exc.start})", field=name) from None


def request_fields(
    *, max_depth: Any, budget: RunBudget | None, tool_filter: Any, output_schema: Any = None, texts: dict[str, str | None] | None = None,
) -> RequestFields:
    """Check the request's fields in the order callers see their errors: max_depth, budget, output_schema,
    tool_filter, then ``texts`` (the other text fields that travel to the worker: persona, model, ...)."""
    depth = _max_depth(max_depth)
    checked_budget = _budget(budget)
    _output_schema(output_schema)
    checked_filter = _tool_filter(tool_filter)
    if checked_filter is not None:
        for names in (checked_filter.allow, checked_filter.deny):
            _encodable("tool_filter", list(names or []))
    for name, text in (texts or {}).items():
        _encodable(name, text)
    return RequestFields(depth, checked_budget, checked_filter)


def place_child(
    agents: LiveAgents, store: Store, parent_id: str, *, max_depth: int | None, host_max_depth: int | None, sandbox: str | None,
) -> Placement:
    """The policy snapshot of the parent (no await: it is the state at the call) and the child's depth check.

    A live agent's depth already includes its header's (``open_root`` and the
    starts read it); a parent known only from the store contributes its
    header's depth and no sandbox mode. A mode asked for may narrow the
    parent's, never widen it (``INVALID_REQUEST``). ``host_max_depth`` is the
    supervisor's own cap; the request's, when narrower or equal, is the one named.
    """
    live = agents.get(parent_id)
    if live is not None:
        parent_depth, parent_sandbox = live.depth, live.sandbox
    else:
        try:
            parent_depth, parent_sandbox = read_header(store, parent_id).delegation_depth, None
        except SessionNotFoundError:
            raise NoParentError(parent_id) from None
    depth = parent_depth + 1
    if max_depth is not None and depth > max_depth:
        raise SubagentDepthError(depth, max_depth)
    if host_max_depth is not None and depth > host_max_depth:
        raise SubagentDepthError(depth, host_max_depth, host=True)
    if sandbox is not None and parent_sandbox is not None and SANDBOX_MODES.index(sandbox) > SANDBOX_MODES.index(parent_sandbox):
        # the modes run from the narrowest to the widest: a read-only agent could otherwise have a
        # child write for it, which is the widening the delegation rule forbids
        raise InvalidRequestError(f'sandbox "{sandbox}" is wider than its parent\'s "{parent_sandbox}": '
                                  "a child's permission scope cannot be widened", field="sandbox")
    return Placement(parent_id, depth, sandbox if sandbox is not None else parent_sandbox, stored=live is None)


def prompt_text(prompt: Any) -> str:
    """A prompt as the child's message: text as is, anything else as JSON (``INVALID_REQUEST`` when it is none)."""
    if isinstance(prompt, str):
        return prompt
    try:
        return json.dumps(prompt, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"a prompt or message must be text or a JSON document ({type(exc).__name__}: {exc})") from None


def _framed_bytes(kind: str, data: dict[str, Any]) -> int | None:
    """The size the store's limit is checked against for the event at its widest; None for data msgpack
    cannot encode (the creation names that itself)."""
    try:
        return len(msgpack.packb(widest_event(kind, data), use_bin_type=True))
    except (TypeError, ValueError, OverflowError):
        return None


def check_label_fits(descriptor: OneShotDescriptor | ContinuableDescriptor, limit: int) -> None:
    """``LABEL_TOO_LARGE`` for a label its descriptor's record cannot hold within the store's ``limit``,
    before anything is made. The creation refused it too, but as ``RECORD_TOO_LARGE: a "subagent/descriptor"
    event ...``, a record the caller never wrote. The label is named when it is what does not fit (the
    record would fit with an empty one); a record too large without it is left to the creation's refusal."""
    record = descriptor.to_record()
    size = _framed_bytes("subagent/descriptor", record)
    if size is None or size <= limit or not descriptor.label:
        return
    without = _framed_bytes("subagent/descriptor", {**record, "label": ""})
    if without is not None and without <= limit:
        raise InvalidRequestError.label_too_large(descriptor.label, size, limit)


def delegation_events(
    sandbox: str | None, descriptor: OneShotDescriptor | ContinuableDescriptor, *, fork: bool = False,
) -> list[tuple[str, Any]]:
    """The events every child's log opens with: the delegated sandbox mode, no interactive approval, the descriptor.

    A ``fork`` (a child seeded with its source's prefix) opens with its descriptor, then ``session/end-seed``,
    then the policy: the reference's seed is the prefix and the descriptor, which its session closes, and the
    policy is written after; so the fork's descriptor is at ``seq == seed_length``, where resume looks first,
    and a reader of the log sees the seed close right after it."""
    policy: list[tuple[str, Any]] = []
    if sandbox is not None:
        policy.append(("sandbox/mode", {"mode": sandbox, "source": "delegation"}))
    policy.append(("approval/policy", {"policy": "never", "source": "delegation"}))
    if fork:
        return [("subagent/descriptor", descriptor.to_record()), ("session/end-seed", {}), *policy]
    return [*policy, ("subagent/descriptor", descriptor.to_record())]
