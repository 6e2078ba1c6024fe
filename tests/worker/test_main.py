"""The worker process spoken to directly over its pipe: READY, turns, cancel, RPC, and never outliving its supervisor."""

from __future__ import annotations

import json
import os
import time

import multiprocess
import pytest

from subagents.store import Store, acquire_lease, create_session
from subagents.worker import worker_entry
from subagents.worker.protocol import (
    Cancel, Ready, Reply, Rpc, RunTurn, Shutdown, Started, TurnDone, TurnSpec, Withdraw, Withdrawn, decode, encode,
)

from ..conftest import events_of, helper

DEADLINE_S = 20.0


class Peer:
    """The supervisor's end of one worker's pipe, every receive under a deadline."""

    def __init__(self) -> None:
        ctx = multiprocess.get_context("forkserver")
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=worker_entry, args=(child,), daemon=True)
        self.process.start()
        child.close()

    def recv(self, timeout: float = DEADLINE_S):
        if not self.conn.poll(timeout):
            pytest.fail(f"worker {self.process.pid} sent nothing for {timeout}s")
        return decode(self.conn.recv_bytes())

    def send(self, message) -> None:
        self.conn.send_bytes(encode(message))

    def close(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(DEADLINE_S)
        self.conn.close()


@pytest.fixture
def peer():
    p = Peer()
    try:
        yield p
    finally:
        p.close()


def session(tmp_path, session_id: str, program: str, message) -> TurnSpec:
    st = Store(tmp_path / "store", durability="none")
    create_session(st, session_id)
    epoch = acquire_lease(st, session_id, "01OWNER").epoch
    return TurnSpec(
        session_id=session_id, epoch=epoch, store_root=st.root, durability="none", program=program, message_id="01M",
        message_source={"kind": "user"}, message=message, log_message=True, depth=1, mode="one-shot",
    )


def test_ready_then_echo_then_shutdown(peer, tmp_path):
    hello = peer.recv()
    assert hello == Ready(pid=peer.process.pid)
    peer.send(RunTurn(call_id=7, spec=session(tmp_path, "01ECHO", "echo", "ping")))
    done = peer.recv()
    assert isinstance(done, TurnDone) and done.call_id == 7
    assert (done.outcome.stop_reason, done.outcome.output, done.outcome.steps) == ("completed", "ping", 1)
    peer.send(Shutdown())
    peer.process.join(DEADLINE_S)
    assert peer.process.exitcode == 0


def event_types(tmp_path, session_id: str) -> list[str]:
    """The types of the events in the session's log (of the store ``session`` creates)."""
    return [e["type"] for e in events_of(Store(tmp_path / "store", durability="none", create=False), session_id)]


def wait_for_turn_start(tmp_path, session_id: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while "turn/start" not in event_types(tmp_path, session_id):
        assert time.monotonic() < deadline, "the turn never started"
        time.sleep(0.005)  # polling a file condition under a deadline


def test_cancel_a_resident_turn(peer, tmp_path):
    peer.recv()
    spec = session(tmp_path, "01SLEEP", "script", json.dumps([{"sleep": 30_000}]))
    peer.send(RunTurn(call_id=1, spec=spec))
    wait_for_turn_start(tmp_path, "01SLEEP")
    peer.send(Cancel(call_id=1, reason="user"))
    done = peer.recv()
    assert (done.outcome.stop_reason, done.outcome.diagnostic) == ("aborted", "the turn was cancelled (user)")


def test_rpc_round_trip_and_remote_error(peer, tmp_path):
    """A spawn RPC goes out with the turn's call id; an error reply is rebuilt in the program."""
    peer.recv()
    spec = session(tmp_path, "01RPC", "script", json.dumps([{"spawn": {"prompt": "x", "provider": "echo"}}]))
    peer.send(RunTurn(call_id=3, spec=spec))
    rpc = peer.recv()
    assert isinstance(rpc, Rpc) and (rpc.call_id, rpc.method) == (3, "spawn_wait")
    assert rpc.args["prompt"] == "x" and rpc.args["provider"] == "echo"
    peer.send(Reply(rpc_id=rpc.rpc_id, ok=False, error={"class": "SubagentError", "module": "subagents.store.errors", "code": "NO_PROVIDER", "message": "nope", "fields": {}}))
    done = peer.recv()
    assert (done.outcome.stop_reason, done.outcome.diagnostic) == ("error", "NO_PROVIDER: nope")


def test_two_turns_resident_at_once(peer, tmp_path):
    """A turn parked on an RPC leaves the worker's loop free for another turn."""
    peer.recv()
    parent = session(tmp_path, "01PARENT", "script", json.dumps([{"spawn": {"prompt": "x", "provider": "echo"}}]))
    peer.send(RunTurn(call_id=1, spec=parent))
    rpc = peer.recv()
    assert isinstance(rpc, Rpc)
    peer.send(RunTurn(call_id=2, spec=session(tmp_path, "01OTHER", "echo", "meanwhile")))
    other = peer.recv()
    assert isinstance(other, TurnDone) and other.call_id == 2 and other.outcome.output == "meanwhile"
    peer.send(Reply(rpc_id=rpc.rpc_id, ok=True, value={"id": "01KID", "output": "kid", "stop_reason": "completed"}))
    done = peer.recv()
    assert (done.call_id, done.outcome.output) == (1, "kid")


def test_a_structured_value_the_pipe_cannot_carry_ends_the_turn_not_the_worker(peer, tmp_path):
    """It used to fail outside the runner (its ``TurnDone`` could not be encoded) and end the worker, while
    the log said ``completed``: the turn's end refuses it first, in the log and the outcome alike."""
    peer.recv()
    peer.send(RunTurn(call_id=1, spec=session(tmp_path, "01BAD", helper("unsendable"), "m")))
    done = peer.recv()
    assert isinstance(done, TurnDone) and done.call_id == 1
    assert done.outcome.stop_reason == "error" and done.outcome.diagnostic.startswith("TypeError: TurnResult.structured cannot be stored")
    assert peer.process.is_alive()


def test_shutdown_with_a_resident_turn_exits_cleanly(peer, tmp_path):
    """Shutdown stops a resident turn as a cancel would: it reports ``aborted``, its log is closed, then the worker exits."""
    peer.recv()
    spec = session(tmp_path, "01SLEEP", "script", json.dumps([{"sleep": 30_000}]))
    peer.send(RunTurn(call_id=1, spec=spec))
    wait_for_turn_start(tmp_path, "01SLEEP")
    peer.send(Shutdown())
    done = peer.recv()
    assert isinstance(done, TurnDone) and done.call_id == 1
    assert (done.outcome.stop_reason, done.outcome.diagnostic) == ("aborted", "the turn was cancelled (shutdown)")
    peer.process.join(DEADLINE_S)
    assert peer.process.exitcode == 0
    assert event_types(tmp_path, "01SLEEP")[-1] == "turn/end"


def test_worker_exits_when_its_supervisor_goes_away(peer):
    """End-of-file on the pipe ends the worker at once, even with nothing to do."""
    peer.recv()
    peer.conn.close()
    peer.process.join(DEADLINE_S)
    assert peer.process.exitcode == 0
    assert not peer.process.is_alive()
    with pytest.raises(ProcessLookupError):
        os.kill(peer.process.pid, 0)


def test_a_worker_whose_host_died_exits_quietly(tmp_path):
    """Issue #14 defect 9: writing to the pipe of a dead host ends the worker without a BrokenPipeError traceback."""
    import subprocess
    import sys

    script = (
        "import multiprocess\n"
        "from subagents.worker import worker_entry\n"
        "host, mine = multiprocess.Pipe(duplex=True)\n"
        "host.close()  # the host is gone before the worker says READY\n"
        "worker_entry(mine)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=DEADLINE_S, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")


# -- turns handed over ahead (``RunTurn.queued``): the worker runs one turn at a time by default ----------


def held(tmp_path, session_id: str, gate) -> TurnSpec:
    """A turn that runs until the file ``gate`` exists."""
    return session(tmp_path, session_id, "script", json.dumps([{"hold": str(gate)}, {"return": "held"}]))


def one_running_one_waiting(peer, tmp_path):
    """Turn 1 (01FIRST) running until the returned gate opens; turn 2 (01AHEAD, echo) queued behind it."""
    peer.recv()
    gate = tmp_path / "gate"
    peer.send(RunTurn(call_id=1, spec=held(tmp_path, "01FIRST", gate)))
    peer.send(RunTurn(call_id=2, spec=session(tmp_path, "01AHEAD", "echo", "next"), queued=True))
    wait_for_turn_start(tmp_path, "01FIRST")
    return gate


def received(peer, count: int) -> list[tuple[str, int]]:
    return [(type(m).__name__, m.call_id) for m in (peer.recv() for _ in range(count))]


def test_a_queued_turn_waits_for_the_running_one_then_starts_at_once(peer, tmp_path):
    """A queued turn waits in the worker, unwritten; when the running turn ends it starts with no message
    from the supervisor, and ``Started`` comes before anything of it."""
    gate = one_running_one_waiting(peer, tmp_path)
    assert not peer.conn.poll(0.3), "the queued turn must wait for the running one"
    assert event_types(tmp_path, "01AHEAD") == []
    gate.touch()
    first, started, second = (peer.recv() for _ in range(3))
    assert (type(first), first.call_id, first.outcome.stop_reason) == (TurnDone, 1, "completed")
    assert started == Started(call_id=2)
    assert (type(second), second.call_id, second.outcome.output) == (TurnDone, 2, "next")


def test_withdraw_gives_back_a_waiting_turn_and_not_a_started_one(peer, tmp_path):
    gate = one_running_one_waiting(peer, tmp_path)
    peer.send(Withdraw(call_id=2))
    assert peer.recv() == Withdrawn(call_id=2)
    peer.send(Withdraw(call_id=1))  # running: nothing comes back, it goes on
    gate.touch()
    assert received(peer, 1) == [("TurnDone", 1)]
    assert not peer.conn.poll(0.3), "a withdrawn turn never runs here"
    assert event_types(tmp_path, "01AHEAD") == []


def test_cancel_of_a_waiting_turn_ends_it_unwritten(peer, tmp_path):
    gate = one_running_one_waiting(peer, tmp_path)
    peer.send(Cancel(call_id=2, reason="user"))
    done = peer.recv()
    assert (done.call_id, done.outcome.stop_reason, done.outcome.diagnostic) == (
        2, "aborted", "the turn was cancelled (user) before it started")
    assert event_types(tmp_path, "01AHEAD") == []
    gate.touch()
    assert received(peer, 1) == [("TurnDone", 1)]


def test_a_turn_parked_in_a_waiting_rpc_lets_the_queued_turn_run(peer, tmp_path):
    """A turn waiting on its child (``spawn_wait``) frees its slot, as the pool counts it: the queued
    turn runs meanwhile (nested delegation never waits on a turn queued behind it)."""
    peer.recv()
    spawner = session(tmp_path, "01PARENT", "script", json.dumps([{"spawn": {"prompt": "x", "provider": "echo"}}]))
    peer.send(RunTurn(call_id=1, spec=spawner))
    rpc = peer.recv()
    assert isinstance(rpc, Rpc) and rpc.method == "spawn_wait"
    peer.send(RunTurn(call_id=2, spec=session(tmp_path, "01AHEAD", "echo", "next"), queued=True))
    assert received(peer, 2) == [("Started", 2), ("TurnDone", 2)]
    peer.send(Reply(rpc_id=rpc.rpc_id, ok=False, error={"code": "INTERNAL", "message": "no child here"}))
    assert received(peer, 1) == [("TurnDone", 1)]


def test_shutdown_ends_a_waiting_turn_unwritten(peer, tmp_path):
    one_running_one_waiting(peer, tmp_path)  # its gate never opens
    peer.send(Shutdown())
    waiting, running = peer.recv(), peer.recv()
    assert (waiting.call_id, waiting.outcome.diagnostic) == (2, "the turn was cancelled (shutdown) before it started")
    assert (running.call_id, running.outcome.diagnostic) == (1, "the turn was cancelled (shutdown)")
    peer.process.join(DEADLINE_S)
    assert peer.process.exitcode == 0
    assert event_types(tmp_path, "01AHEAD") == []
