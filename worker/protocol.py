"""The pipe protocol between a supervisor and its worker processes.

One definition, imported by both sides. Every message is a msgpack map sent
with ``send_bytes`` (the control plane never pickles); the ``op`` field names
the message class below. Only a program given as a callable object (no import
path) travels pickled, by dill, inside ``RunTurn.program_blob``.

    supervisor → worker   RunTurn, Cancel, Withdraw, Reply, Shutdown
    worker → supervisor   Ready, TurnDone, Started, Withdrawn, Rpc

A turn is identified by ``call_id``. A ``RunTurn`` marked ``queued`` was
handed over ahead of a free slot (prefetched) and may wait in the worker;
``Started`` and ``Withdrawn`` tell the supervisor what became of it. ``Rpc`` is a worker's request to the
supervisor on behalf of a turn (spawn a child, wait for it, list, report...);
the supervisor answers with ``Reply`` carrying a value or an error as data.

The messages are plain dataclasses, not pydantic models: both ends are this
package, every message crosses on the per-child path (a one-shot child costs
a ``RunTurn`` and a ``TurnDone``), and validating each one cost more CPU than
the rest of the pipe work. ``decode`` still refuses what is not a message of
this protocol — an unknown ``op``, an unknown or missing field — with
``ProtocolError``; the values' types are the sender's (the supervisor
validates what users give it before it builds a message).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

import msgpack

from .errors import ProtocolError

__all__ = [
    "CancelRpc",
    "Budget",
    "TurnSpec",
    "RunTurn",
    "Cancel",
    "Withdraw",
    "Reply",
    "Shutdown",
    "Ready",
    "TurnOutcome",
    "TurnDone",
    "Started",
    "Withdrawn",
    "Rpc",
    "cancelled_before_start",
    "encode",
    "decode",
    "non_text_key",
    "BLOCKING_RPCS",
    "CHILD_STARTS",
]


@dataclass
class Budget:
    max_steps: int | None = None
    timeout_ms: int | None = None


@dataclass
class TurnSpec:
    """Everything a worker needs to run one turn of one session."""

    session_id: str
    epoch: int
    store_root: str
    durability: str
    message_id: str
    message_source: dict[str, Any]
    message: Any
    log_message: bool  # append message/accepted (False when creation already wrote it)
    depth: int
    mode: Literal["one-shot", "continuable", "root"]
    program: str | None = None
    program_blob: bytes | None = None
    message_mailbox_end: int | None = None  # recorded with message/accepted: where the mailbox's unconsumed part starts
    budget: Budget = field(default_factory=Budget)
    label: str | None = None
    provider: str | None = None
    parent_session: str | None = None
    persona: str | None = None
    tool_filter: dict[str, list[str]] | None = None
    sandbox: str | None = None
    output_schema: dict[str, Any] | None = None
    agent_model: str | None = None
    notices: list[dict[str, Any]] = field(default_factory=list)
    # one-shot turns: the worker releases the lease (this owner, ``epoch``) with the
    # turn's closing commit, sparing the supervisor a store round trip per child
    release_owner: str | None = None
    # the session as its creator left it (``{"header": SessionHeader.to_record(), "projection":
    # Projection.to_record()}``), for a turn that runs right after creation: the worker attaches
    # to the log (``LogWriter.attach``) instead of reading the header, the identity cache and the log
    log_state: dict[str, Any] | None = None


@dataclass
class TurnOutcome:
    stop_reason: str
    output: str = ""
    structured: Any = None
    diagnostic: str | None = None
    steps: int = 0
    fenced: bool = False  # another supervisor took the session over: the turn wrote nothing more
    released: bool = False  # the worker released the lease after the commit (``TurnSpec.release_owner``)


def cancelled_before_start(reason: str) -> TurnOutcome:
    """The outcome of a turn cancelled before it started (queued in the pool or waiting in a worker): nothing written."""
    return TurnOutcome(stop_reason="aborted", diagnostic=f"the turn was cancelled ({reason}) before it started")


@dataclass
class RunTurn:
    op: ClassVar[str] = "run"
    call_id: int
    spec: TurnSpec
    # where the pool dispatched the turn (``host:pid``, on Ray ``ip/node:pid``): the worker
    # records it in ``turn/start`` so any process can say where a running turn runs
    node: str | None = None
    # handed over ahead (prefetched): it may wait in the worker behind the turns running there;
    # the worker sends ``Started`` before it starts it, or ``Withdrawn`` if asked back first
    queued: bool = False
    # its token, which the worker takes before it acts on the turn, and the pool takes to have it back
    # from a stopped worker (``worker/claims.py``); None: nobody takes it back unasked
    token: str | None = None


@dataclass
class Cancel:
    op: ClassVar[str] = "cancel"
    call_id: int
    reason: str = "user"


@dataclass
class Withdraw:
    """Give a queued turn back if it has not started (the pool has a better place for it): ``Withdrawn``, else nothing."""

    op: ClassVar[str] = "withdraw"
    call_id: int


@dataclass
class Reply:
    op: ClassVar[str] = "reply"
    rpc_id: int
    ok: bool
    value: Any = None
    error: dict[str, Any] | None = None


@dataclass
class Shutdown:
    op: ClassVar[str] = "shutdown"


@dataclass
class Ready:
    op: ClassVar[str] = "ready"
    pid: int


@dataclass
class TurnDone:
    op: ClassVar[str] = "done"
    call_id: int
    outcome: TurnOutcome


@dataclass
class Started:
    """A queued turn is starting: sent before the turn's first step, so a worker that dies
    without having sent it never wrote a byte of that turn."""

    op: ClassVar[str] = "started"
    call_id: int


@dataclass
class Withdrawn:
    """A queued turn given back unstarted (the answer to ``Withdraw``): the pool queues it again."""

    op: ClassVar[str] = "withdrawn"
    call_id: int


@dataclass
class Rpc:
    op: ClassVar[str] = "rpc"
    rpc_id: int
    call_id: int
    method: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class CancelRpc:
    """The turn stopped waiting for its request ``rpc_id`` (its program cancelled the call: a timeout of
    its own around ``ctx.spawn``): the host stops serving it, and a child the request waited on is
    stopped with it, as if the turn had ended. Sent for ``BLOCKING_RPCS`` only; no ``Reply`` follows."""

    op: ClassVar[str] = "cancel-rpc"
    rpc_id: int


Message = RunTurn | Cancel | Withdraw | Reply | Shutdown | Ready | TurnDone | Started | Withdrawn | Rpc | CancelRpc

# RPCs during which the calling turn waits on other turns: its worker slot is
# free for them, which is what keeps nested delegation from deadlocking the pool.
BLOCKING_RPCS = frozenset({"spawn_wait", "wait_run"})
# RPCs that create a child of the calling session: while one is unanswered, a creation may
# still add to the session's children index, so its worker leaves the release to the supervisor
CHILD_STARTS = frozenset({"spawn", "spawn_wait", "start_continuable"})

_MESSAGES: dict[str, type] = {
    cls.op: cls for cls in (RunTurn, Cancel, Withdraw, Reply, Shutdown, Ready, TurnDone, Started, Withdrawn, Rpc, CancelRpc)
}
# the field names of each class, in order: what ``encode`` writes and ``decode`` accepts
_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in (Budget, TurnSpec, TurnOutcome, *_MESSAGES.values())
}


def _map(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in _FIELDS[type(obj)]}


def encode(message: Message) -> bytes:
    data = _map(message)
    if isinstance(message, RunTurn):
        spec = _map(message.spec)
        spec["budget"] = _map(message.spec.budget)
        data["spec"] = spec
    elif isinstance(message, TurnDone):
        data["outcome"] = _map(message.outcome)
    data["op"] = message.op
    return msgpack.packb(data, use_bin_type=True)


def _build(cls: type, data: Any) -> Any:
    if not isinstance(data, dict):
        raise ProtocolError(f"a {cls.__name__} must be a map, not {type(data).__name__}")
    try:
        return cls(**data)
    except TypeError as exc:  # an unknown or a missing field
        raise ProtocolError(f"not a {cls.__name__}: {exc}") from None


def non_text_key(value: Any) -> str | None:
    """Where ``value`` holds a map key that is not text (``a map key at [1] is int, not text``), or None.

    msgpack carries such keys, but JSON (every reader prints records as JSON: ``--json``, notices) turns
    them into text, and a map keyed by a tuple has no JSON at all: a program's value is refused here,
    before it is sent, instead of reaching the host as something no record can say the same way.
    Called on a value msgpack already packed, so its nesting is bounded."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                at = f"{where}[{key!r}]"
                if not isinstance(key, str):
                    return f"a map key at {at} is {type(key).__name__}, not text"
                stack.append((inner, at))
        elif isinstance(item, (list, tuple)):
            stack.extend((inner, f"{where}[{i}]") for i, inner in enumerate(item))
    return None


def decode(raw: bytes) -> Message:
    """The message in ``raw``; ``ProtocolError`` when it is not one of this protocol (bytes that are no
    msgpack too: the caller decides what becomes of the peer that sent them)."""
    try:
        # any key msgpack carries: what a map may hold is the sender's check (``non_text_key``), and a
        # strict reader here raised in the host's pipe reader, which ended the whole supervisor
        data = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise ProtocolError(f"not a msgpack message ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise ProtocolError("a message must be a map")
    cls = _MESSAGES.get(data.pop("op", None))
    if cls is None:
        raise ProtocolError("unknown message op")
    if cls is RunTurn:
        spec = data.get("spec")
        if not isinstance(spec, dict):
            raise ProtocolError("a RunTurn's spec must be a map")
        spec["budget"] = _build(Budget, spec.get("budget", {}))
        data["spec"] = _build(TurnSpec, spec)
    elif cls is TurnDone:
        data["outcome"] = _build(TurnOutcome, data.get("outcome"))
    return _build(cls, data)
