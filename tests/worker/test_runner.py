"""``TurnRunner`` driven by a host other than the pipe loop: what a cluster actor would do.

The host here is the test itself: it hands the runner a ``RunTurn``, answers
its ``Rpc`` requests with ``reply``, and cancels with ``cancel``. The turn's
store access goes through a ``SessionAccess`` of the host's choosing.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from subagents.store import Store, acquire_lease, create_session, inspect
from subagents.worker import LocalSessions, SessionWriter, TurnRunner
from subagents.worker.protocol import Budget, Cancel, Reply, Rpc, RunTurn, TurnSpec

pytestmark = pytest.mark.anyio

DEADLINE_S = 20.0


@pytest.fixture
def st(tmp_path) -> Store:
    return Store(tmp_path / "store", durability="none")


def run_turn_msg(st: Store, session_id: str, message: Any, call_id: int = 1) -> RunTurn:
    create_session(st, session_id)
    epoch = acquire_lease(st, session_id, "01OWNER").epoch
    spec = TurnSpec(
        session_id=session_id, epoch=epoch, store_root=st.root, durability="none", program="script", message_id="01M",
        message_source={"kind": "user"}, message=message, log_message=True, depth=1, mode="one-shot",
    )
    return RunTurn(call_id=call_id, spec=spec)


class CountingSessions(LocalSessions):
    """A host's own ``SessionAccess``: the local store, counting the appends that pass through it."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.appended: list[str] = []

    def open_writer(self, session_id: str, *, epoch: int, log_state=None) -> SessionWriter:
        writer = super().open_writer(session_id, epoch=epoch, log_state=log_state)
        appended = self.appended

        class Counting:
            def __init__(self) -> None:
                self.session_id, self.epoch = writer.session_id, writer.epoch

            def append(self, batch, *, commit=False):
                appended.extend(kind for kind, _ in batch)
                return writer.append(batch, commit=commit)

            async def flush(self) -> None:
                await writer.flush()

            def release_lease(self, owner: str) -> None:
                writer.release_lease(owner)

            def close(self) -> None:
                writer.close()

        return Counting()


async def test_a_host_answers_rpcs_and_appends_go_through_its_session_access(st):
    sessions = CountingSessions(st)
    runner = TurnRunner(lambda spec: sessions)
    msg = run_turn_msg(st, "01RUNNERRPC", json.dumps({"script": [{"list": "children"}, {"return": "done"}]}))
    sent: list[Rpc] = []

    def send(rpc: Rpc) -> None:  # the host's transport: answer at once, as a supervisor would
        sent.append(rpc)
        runner.reply(Reply(rpc_id=rpc.rpc_id, ok=True, value=[]))

    with anyio.fail_after(DEADLINE_S):
        outcome = await runner.run(msg, send)
    assert (outcome.stop_reason, outcome.output) == ("completed", "done")
    assert [(r.call_id, r.method) for r in sent] == [(1, "list_agents")]
    logged = [e["type"] for e in inspect(st, "01RUNNERRPC").events]
    assert sessions.appended == logged and logged[-1] == "turn/end"
    assert runner.resident == 0


async def test_a_cancel_right_behind_its_run_turn_stops_the_turn(st):
    """``admit`` registers the turn synchronously, so a Cancel that arrives before its task runs is not lost."""
    runner = TurnRunner()
    msg = run_turn_msg(st, "01RUNNERCANCEL", json.dumps({"script": [{"sleep": 60_000}]}), call_id=7)
    runner.admit(msg)
    runner.cancel(Cancel(call_id=7, reason="user"))
    with anyio.fail_after(DEADLINE_S):
        outcome = await runner.run(msg, lambda rpc: None)
    assert outcome.stop_reason == "aborted"
    assert inspect(st, "01RUNNERCANCEL").events[-1]["data"]["stop_reason"] == "aborted"


async def test_the_hosts_timeout_cancel_ends_the_turn_budget_exhausted_in_its_log(st):
    """The host holds a turn's ``timeout_ms`` too (``supervisor/dispatch.py``): its cancel, reason ``timeout``,
    can reach a worker before the worker's own timer fires (its loop was blocked). The log said ``aborted``
    while the host made the result ``budget-exhausted``; the turn stops as its timer would stop it."""
    runner = TurnRunner()
    msg = run_turn_msg(st, "01RUNNERTIMEOUT", json.dumps({"script": [{"sleep": 60_000}]}))
    msg.spec.budget = Budget(timeout_ms=60_000)  # the worker's own timer is far off: the host's cancel comes first
    runner.admit(msg)
    runner.cancel(Cancel(call_id=1, reason="timeout"))
    with anyio.fail_after(DEADLINE_S):
        outcome = await runner.run(msg, lambda rpc: None)
    assert (outcome.stop_reason, outcome.diagnostic) == ("budget-exhausted", "the turn exceeded timeout_ms=60000")
    end = inspect(st, "01RUNNERTIMEOUT").events[-1]["data"]
    assert (end["stop_reason"], end["cause"]) == ("budget-exhausted", "timeout")


async def test_an_rpc_error_reply_is_raised_in_the_turn(st):
    runner = TurnRunner()
    msg = run_turn_msg(st, "01RUNNERERR", json.dumps({"script": [{"spawn": {"prompt": "x"}}]}))

    def send(rpc: Rpc) -> None:
        runner.reply(Reply(rpc_id=rpc.rpc_id, ok=False, error={"class": "SubagentError", "module": "x", "code": "NO_PROVIDER", "message": "none"}))

    with anyio.fail_after(DEADLINE_S):
        outcome = await runner.run(msg, send)
    assert (outcome.stop_reason, outcome.diagnostic) == ("error", "NO_PROVIDER: none")
