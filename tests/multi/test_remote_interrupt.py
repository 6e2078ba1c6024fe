"""A user interrupt of a child whose turn another supervisor runs: its answer agrees with what the turn did.

The holder is a Supervisor in another process (``_driver.py``) or the test's
own, and the asker the other one; they share only the store. Each test forces
the interleaving it is about (a turn that ignores cancellation, a holder that
reads the request late) instead of hoping a race comes out that way, and then
checks the answer against the child's log: an interrupt never says nothing
happened while a turn was stopped, nor that it stopped a turn that completed.
"""

from __future__ import annotations

import anyio
import pytest

from subagents import InterruptResult
from subagents.store import inspect, read_controls, read_lease
from subagents.supervisor import Supervisor, SupervisorConfig, UserAuthority

from ._driver import S, poll

pytestmark = pytest.mark.anyio

WAIT_S = 20.0  # the asker's bound on the holder's confirmation: reached only by a regression


def _events(store, child: str) -> list[dict]:
    return inspect(store, child).events


def _turn_ends(store, child: str) -> list[dict]:
    return [e["data"] for e in _events(store, child) if e["type"] == "turn/end"]


def _message_of_turn(store, child: str, number: int) -> str:
    return [e["data"]["message_id"] for e in _events(store, child) if e["type"] == "turn/start"][number - 1]


def _asker(store) -> Supervisor:
    return Supervisor.open(store=str(store), config=SupervisorConfig(pool_size=1, durability="none"))


@pytest.mark.parametrize("mode", ["one-shot", "continuable"])
async def test_a_turn_that_ignores_the_interrupt_is_cancelled_by_killing_its_worker(hosts, tmp_path, mode) -> None:
    """``spin`` blocks its worker's loop: the holder kills the worker past ``cancel_grace_s`` and repairs
    the log. The answer is ``cancelled``, as when the holder is asked in its own process, and the
    repaired ``turn/end`` says the user's interrupt stopped it (its ``cause``), not just a crash."""
    store = tmp_path / "st"
    host = hosts.start(store, cancel_grace_s=0.3, control_poll_s=0.02)
    root = await host.acall("open_root", label="r")
    prompt = S({"say": "spinning"}, {"spin": 60_000})
    if mode == "one-shot":
        child = (await host.acall("start", parent=root, prompt=prompt, provider="script", wait=False))["child"]
    else:
        child = (await host.acall("start_continuable", parent=root, prompt=prompt))[0]
    async with _asker(store) as sup:
        await poll(lambda: any(e["type"] == "assistant/message" for e in _events(sup.store, child)), what="the spin to start")
        result = await sup.interrupt(child, authority=UserAuthority(parent_session=root), wait_s=WAIT_S)
        assert (result.outcome, result.turn, result.message_id, result.host, result.host_pid, result.stop_reason) == (
            "cancelled", 1, _message_of_turn(sup.store, child, 1), host.owner, host.pid, "interrupted"), result
        assert result.detail == f"stopped by supervisor {host.owner} (pid {host.pid}): its worker ignored the interrupt and was killed"
        assert _turn_ends(sup.store, child) == [
            {"stop_reason": "interrupted", "diagnostic": "the turn was interrupted by a crash", "cause": "user"}]


async def test_a_one_shot_turn_that_completed_is_not_reported_cancelled(hosts, tmp_path) -> None:
    """The child's log says its one turn ended ``completed`` while its holder (stopped here, its
    worker running on) still holds the lease; the holder releases it only later. The answer is what
    the log says — no turn running, it ended completed — never "cancelled before a worker took it"
    for the lease let go without another ``turn/end``; and nothing is asked of the holder."""
    store = tmp_path / "st"
    gate = tmp_path / "gate"
    host = hosts.start(store, control_poll_s=0.02, lease_ttl_s=120)  # stopped for a while, still live
    root = await host.acall("open_root", label="r")
    child = (await host.acall("start", parent=root, prompt=str(gate), provider="returns-mid-start", wait=False))["child"]
    async with _asker(store) as sup:
        await poll(lambda: any(e["type"] == "turn/start" for e in _events(sup.store, child)), what="the turn to start")
        host.stop(group=False)  # the supervisor only: its worker ends the turn, then waits for the start's answer
        gate.touch()
        await poll(lambda: _turn_ends(sup.store, child), what="the turn to end")
        assert read_lease(sup.store, child).state == "running"  # held: the worker left the release to its supervisor
        answers: list[InterruptResult] = []

        async def ask() -> None:
            answers.append(await sup.interrupt(child, authority=UserAuthority(parent_session=root), wait_s=WAIT_S))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            await poll(lambda: answers or read_controls(sup.store, child), what="the answer or the request")
            host.cont(group=False)
        await poll(lambda: read_lease(sup.store, child).state == "released", what="the holder to release the child")
        [answer] = answers
        assert (answer.outcome, answer.stop_reason, answer.host, answer.host_pid) == ("no_turn_running", "completed", host.owner, host.pid), answer
        assert answer.detail == "its turn ended completed before the interrupt reached it"
        assert read_controls(sup.store, child) == []
        assert [e["stop_reason"] for e in _turn_ends(sup.store, child)] == ["completed"]
