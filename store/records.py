"""Typed checks of every record the store decodes: the one gate between bytes and code.

A reader never uses a decoded value before it passes here. Each small file
(lease, owner) and each framed record kind (log event, mailbox message,
control request, children-index entry) has one schema. A value of the wrong
type — a string where a number belongs, ``inf`` where an integer belongs, a
list where a type name belongs — is damage of that one file, returned as a
value (``None`` or a problem text), never an exception: the caller turns it
into a diagnostic for that file's session only, so one damaged session never
hides another. Who calls it: every reader in ``store/`` (``lease``,
``mailbox``, ``control``, ``index``, ``reader``, ``projection``).
"""

from __future__ import annotations

import math
from typing import Any, Literal, TypeVar, cast, get_args

import msgpack
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .framing import Check

__all__ = [
    "Checked",
    "LeaseFields",
    "OwnerFields",
    "MailboxFields",
    "ControlFields",
    "IndexFields",
    "index_problem",
    "lease_fields",
    "unpack",
    "validate",
    "decode",
    "problem_of",
    "event_problem",
    "mailbox_problem",
]

M = TypeVar("M", bound=BaseModel)

_INF = float("inf")


class Checked(BaseModel):
    """Strict: no coercion (``"5"`` is not 5, ``True`` is not 1), finite floats only; extra keys are kept out."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore", frozen=True)


LeaseState = Literal["running", "idle", "released"]


class LeaseFields(Checked):
    owner: str
    epoch: int = Field(ge=0)
    state: LeaseState
    acquired_at: float


class OwnerFields(Checked):
    owner: str
    host: str
    pid: int = Field(ge=0)
    pid_start: int | None = None
    started_at: float
    heartbeat_at: float
    ttl: float = Field(gt=0)


class MailboxFields(Checked):
    seq: int
    id: str
    ts: float
    source: dict[str, Any]
    content: Any = None
    wake: bool = True


class ControlFields(Checked):
    seq: int
    id: str
    ts: float
    kind: str
    data: dict[str, Any] = Field(default_factory=dict)


class IndexFields(Checked):
    seq: int
    id: str
    created_at: float = 0.0
    origin: str | None = None
    removed: bool = False
    # the catalog row's fields (FORMAT.md §9): static ones on an entry, the rest on state records
    mode: Literal["one-shot", "continuable"] | None = None
    label: str | None = None
    state: Literal["active", "settled"] | None = None
    outcome: str | None = None
    error_code: str | None = None
    error: str | None = None
    last_at: float = 0.0
    has_children: bool | None = None
    end: int | None = None
    mtime_ns: int | None = None


_INDEX_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,), "origin": (str, type(None)), "removed": (bool,), "mode": (str, type(None)), "label": (str, type(None)),
    "state": (str, type(None)), "outcome": (str, type(None)), "error_code": (str, type(None)), "error": (str, type(None)),
    "has_children": (bool, type(None)), "end": (int, type(None)), "mtime_ns": (int, type(None)),
}


def index_problem(record: dict[str, Any]) -> str | None:
    """A children-index record (``IndexFields``), checked by exact types first: a listing reads
    every record of a parent's file, so a valid one must cost little more than its decoding.
    Anything that does not pass the quick test gets ``IndexFields``'s verdict and text."""
    for key, value in record.items():
        allowed = _INDEX_TYPES.get(key)
        if allowed is not None:
            if type(value) not in allowed:
                break
        elif key in ("created_at", "last_at"):
            if not ((type(value) is float and -_INF < value < _INF) or type(value) is int):
                break
        elif key == "seq":
            if type(value) is not int:
                break
    else:
        if "id" in record and record.get("mode") in _MODES and record.get("state") in _STATES:
            return None
    found = validate(IndexFields, record)
    return found if isinstance(found, str) else None


def lease_fields(data: dict[str, Any]) -> tuple[str, int, LeaseState, float] | str:
    """A lease record's ``(owner, epoch, state, acquired_at)`` (``LeaseFields``), checked by exact types
    first: a listing row reads both lease slots of its child, and the model's validation and the reads
    of its fields were a third of what a slot cost. Anything that does not pass the quick test (an
    integer time included) gets ``LeaseFields``'s verdict and text."""
    owner, epoch, state, at = data.get("owner"), data.get("epoch"), data.get("state"), data.get("acquired_at")
    if (type(owner) is str and type(epoch) is int and epoch >= 0 and type(state) is str and state in _LEASE_STATES
            and type(at) is float and -_INF < at < _INF):
        return owner, epoch, cast(LeaseState, state), at
    found = validate(LeaseFields, data)
    return found if isinstance(found, str) else (found.owner, found.epoch, found.state, found.acquired_at)


_LEASE_STATES = get_args(LeaseState)
_MODES = (None, "one-shot", "continuable")
_STATES = (None, "active", "settled")


def unpack(raw: bytes) -> Any:
    """The msgpack value in ``raw``; ``ValueError`` for anything that is not exactly one value."""
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise ValueError(f"not msgpack ({type(exc).__name__})") from None


def validate(model: type[M], data: Any) -> M | str:
    """``data`` as ``model``, or the first problem as text."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "record"
        return f"{where}: {first['msg']}"


def decode(model: type[M], raw: bytes) -> M | str:
    """Unpack and validate a whole small file (lease, owner)."""
    try:
        data = unpack(raw)
    except ValueError as exc:
        return str(exc)
    return validate(model, data)


def problem_of(model: type[BaseModel]) -> Check:
    """A framing ``Check`` for ``model``: the problem text of a record, ``None`` when it is valid."""

    def check(record: dict[str, Any]) -> str | None:
        found = validate(model, record)
        return found if isinstance(found, str) else None

    return check


_model_problem = problem_of(MailboxFields)


def mailbox_problem(record: dict[str, Any]) -> str | None:
    """A mailbox record (``MailboxFields``), checked by exact types first: every acceptance checks its
    message and every read each record, so a record of the types a writer writes (an ``int`` seq, a
    ``str`` id, a finite ``float`` ts, a ``dict`` source keyed by ``str``, a ``bool`` wake or none)
    costs a few type tests, not a model. Anything else gets ``MailboxFields``'s verdict and text."""
    ts = record.get("ts")
    source = record.get("source")
    if (
        type(record.get("seq")) is int
        and type(record.get("id")) is str
        and type(ts) is float
        and -_INF < ts < _INF
        and type(source) is dict
        and type(record.get("wake", True)) is bool
        and all(type(key) is str for key in source)
    ):
        return None
    return _model_problem(record)


def finite_number(value: Any) -> bool:
    """A number a float holds: no bool, NaN or infinity, and no int past a float's range (``math.isfinite``
    raises ``OverflowError`` for ``10**400``, which reached callers as a bare exception)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def event_problem(record: dict[str, Any]) -> str | None:
    """The log event envelope ``{seq, ts, type, data, epoch}`` (+ ``ignorable``).

    Explicit checks, not a model: every event of every log read passes here.
    The first test is one expression over exact types (a valid event costs
    about as much as a dict lookup per field); only an invalid one takes the
    slow path that says what is wrong. ``data`` is the event kind's own
    business (folds check what they use).
    """
    ts = record.get("ts")
    epoch = record.get("epoch", 0)
    if (
        type(record.get("type")) is str
        and ((type(ts) is float and -_INF < ts < _INF) or type(ts) is int)
        and type(epoch) is int
        and epoch >= 0
        and type(record.get("ignorable", False)) is bool
    ):
        return None
    return _envelope_problem(record)


def _envelope_problem(record: dict[str, Any]) -> str | None:
    kind = record.get("type")
    if not isinstance(kind, str):
        return f"type must be a string, not {type(kind).__name__}"
    if not finite_number(record.get("ts")):
        return "ts must be a finite number"
    epoch = record.get("epoch", 0)
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        return "epoch must be a non-negative integer"
    ignorable = record.get("ignorable")
    if ignorable is not None and not isinstance(ignorable, bool):
        return "ignorable must be a boolean"
    return None  # a subclass of str/int/float: still a valid envelope
