"""The pipe protocol: every message round-trips through msgpack; errors travel as data."""

from __future__ import annotations

import signal

import pytest

from subagents.store.errors import SubagentError, from_wire
from subagents.supervisor import InvalidRequestError, SubagentDepthError
from subagents.worker import WorkerCrashedError
from subagents.worker.errors import ProtocolError, describe_exit
from subagents.worker.protocol import Budget, Cancel, Ready, Reply, Rpc, RunTurn, Shutdown, TurnDone, TurnOutcome, TurnSpec, decode, encode

SPEC = TurnSpec(
    session_id="01S", epoch=3, store_root="/tmp/x", durability="none", program="echo", message_id="01M",
    message_source={"kind": "user"}, message={"nested": [1, "two"]}, log_message=False, budget=Budget(max_steps=2),
    depth=1, mode="one-shot", tool_filter={"deny": ["add"]}, program_blob=b"\x00\x01",
)


@pytest.mark.parametrize("message", [
    RunTurn(call_id=1, spec=SPEC),
    Cancel(call_id=1, reason="disposed"),
    Reply(rpc_id=2, ok=True, value={"id": "x"}),
    Reply(rpc_id=2, ok=False, error={"code": "X"}),
    Shutdown(),
    Ready(pid=123),
    TurnDone(call_id=1, outcome=TurnOutcome(output="o", stop_reason="completed", steps=2)),
    Rpc(rpc_id=5, call_id=1, method="spawn_wait", args={"prompt": "p"}),
])
def test_round_trip(message):
    assert decode(encode(message)) == message


def test_unknown_op_is_refused():
    import msgpack

    with pytest.raises(ProtocolError):
        decode(msgpack.packb({"op": "pickle-me"}))


def test_extra_fields_are_refused():
    import msgpack

    with pytest.raises(ProtocolError):
        decode(msgpack.packb({"op": "ready", "pid": 1, "evil": True}))


@pytest.mark.parametrize("data", [
    {"op": "ready"},  # a missing field
    {"op": "run", "call_id": 1, "spec": "not a map"},
    {"op": "run", "call_id": 1, "spec": {"session_id": "01S", "surprise": 1}},
    {"op": "done", "call_id": 1, "outcome": {"stop_reason": "completed", "evil": True}},
    ["op", "ready"],
])
def test_malformed_messages_are_refused_with_a_protocol_error(data):
    import msgpack

    with pytest.raises(ProtocolError) as caught:
        decode(msgpack.packb(data))
    assert caught.value.code == "PROTOCOL"


@pytest.mark.parametrize("error", [
    SubagentDepthError(3, 2),
    InvalidRequestError("bad", field="max_steps"),
    WorkerCrashedError(42, -signal.SIGKILL),
    SubagentError("x", code="NO_RUN", run_id="r"),
])
def test_errors_are_rebuilt_as_the_same_class(error):
    rebuilt = from_wire(error.to_wire())
    assert type(rebuilt) is type(error)
    assert (rebuilt.code, str(rebuilt), rebuilt.fields) == (error.code, str(error), error.fields)


def test_depth_error_fields_survive():
    rebuilt = from_wire(SubagentDepthError(3, 2).to_wire())
    assert (rebuilt.attempted_depth, rebuilt.max_depth) == (3, 2)


def test_crash_error_names_pid_and_signal():
    err = WorkerCrashedError(4242, -signal.SIGKILL)
    assert str(err) == "worker process 4242 killed by signal SIGKILL"
    assert (err.pid, err.exitcode, err.code) == (4242, -9, "WORKER_CRASHED")


@pytest.mark.parametrize("code, text", [(None, "still running"), (0, "exited with code 0"), (3, "exited with code 3"), (-15, "killed by signal SIGTERM"), (-200, "killed by signal 200")])
def test_describe_exit(code, text):
    assert describe_exit(code) == text
