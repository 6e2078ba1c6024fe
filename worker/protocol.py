"""The pipe protocol between a supervisor and its worker processes.

One definition, imported by both sides. Every message is a msgpack map sent
with ``send_bytes`` (the control plane never pickles); the ``op`` field names
the model below. Only a program given as a callable object (no import path)
travels pickled, by dill, inside ``RunTurn.program_blob``.

    supervisor → worker   RunTurn, Cancel, Reply, Shutdown
    worker → supervisor   Ready, TurnDone, Rpc

A turn is identified by ``call_id``. ``Rpc`` is a worker's request to the
supervisor on behalf of a turn (spawn a child, wait for it, list, report...);
the supervisor answers with ``Reply`` carrying a value or an error as data.
"""

from __future__ import annotations

from typing import Any, Literal

import msgpack
from pydantic import BaseModel, ConfigDict

__all__ = [
    "Budget",
    "TurnSpec",
    "RunTurn",
    "Cancel",
    "Reply",
    "Shutdown",
    "Ready",
    "TurnOutcome",
    "TurnDone",
    "Rpc",
    "encode",
    "decode",
    "BLOCKING_RPCS",
]


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Budget(_Msg):
    max_steps: int | None = None
    timeout_ms: int | None = None


class TurnSpec(_Msg):
    """Everything a worker needs to run one turn of one session."""

    session_id: str
    epoch: int
    store_root: str
    durability: str
    program: str | None = None
    program_blob: bytes | None = None
    message_id: str
    message_source: dict[str, Any]
    message: Any
    log_message: bool  # append message/accepted (False when creation already wrote it)
    message_mailbox_end: int | None = None  # recorded with message/accepted: where the mailbox's unconsumed part starts
    budget: Budget = Budget()
    depth: int
    mode: Literal["one-shot", "continuable", "root"]
    label: str | None = None
    provider: str | None = None
    parent_session: str | None = None
    persona: str | None = None
    tool_filter: dict[str, list[str]] | None = None
    sandbox: str | None = None
    output_schema: dict[str, Any] | None = None
    agent_model: str | None = None
    notices: list[dict[str, Any]] = []
    # one-shot turns: the worker releases the lease (this owner, ``epoch``) with the
    # turn's closing commit, sparing the supervisor a store round trip per child
    release_owner: str | None = None
    # the log as its creator left it (``Projection.to_record``), for a turn that runs right
    # after creation: the worker attaches to the log (``LogWriter.attach``) instead of
    # reading the header, the identity cache and the log again
    log_state: dict[str, Any] | None = None


class RunTurn(_Msg):
    op: Literal["run"] = "run"
    call_id: int
    spec: TurnSpec
    # where the pool dispatched the turn (``host:pid``, on Ray ``ip/node:pid``): the worker
    # records it in ``turn/start`` so any process can say where a running turn runs
    node: str | None = None


class Cancel(_Msg):
    op: Literal["cancel"] = "cancel"
    call_id: int
    reason: str = "user"


class Reply(_Msg):
    op: Literal["reply"] = "reply"
    rpc_id: int
    ok: bool
    value: Any = None
    error: dict[str, Any] | None = None


class Shutdown(_Msg):
    op: Literal["shutdown"] = "shutdown"


class Ready(_Msg):
    op: Literal["ready"] = "ready"
    pid: int


class TurnOutcome(_Msg):
    output: str = ""
    structured: Any = None
    stop_reason: str
    diagnostic: str | None = None
    steps: int = 0
    fenced: bool = False  # another supervisor took the session over: the turn wrote nothing more
    released: bool = False  # the worker released the lease after the commit (``TurnSpec.release_owner``)


class TurnDone(_Msg):
    op: Literal["done"] = "done"
    call_id: int
    outcome: TurnOutcome


class Rpc(_Msg):
    op: Literal["rpc"] = "rpc"
    rpc_id: int
    call_id: int
    method: str
    args: dict[str, Any] = {}


# RPCs during which the calling turn waits on other turns: its worker slot is
# free for them, which is what keeps nested delegation from deadlocking the pool.
BLOCKING_RPCS = frozenset({"spawn_wait", "wait_run"})

_MODELS: dict[str, type[_Msg]] = {
    "run": RunTurn,
    "cancel": Cancel,
    "reply": Reply,
    "shutdown": Shutdown,
    "ready": Ready,
    "done": TurnDone,
    "rpc": Rpc,
}


def encode(message: _Msg) -> bytes:
    return msgpack.packb(message.model_dump(), use_bin_type=True)


def decode(raw: bytes) -> _Msg:
    data = msgpack.unpackb(raw, raw=False)
    return _MODELS[data["op"]].model_validate(data)
