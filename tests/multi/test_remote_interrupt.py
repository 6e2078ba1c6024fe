"""A user interrupt of a child whose turn another supervisor runs: its answer agrees with what the turn did.

The holder is a Supervisor in another process (``_driver.py``) or the test's
own, and the asker the other one; they share only the store. Each test forces
the interleaving it is about (a turn that ignores cancellation, a holder that
reads the request late) instead of hoping a race comes out that way, and then
checks the answer against the child's log: an interrupt never says nothing
happened while a turn was stopped, nor that it stopped a turn that completed.
"""

from __future__ import annotations

import os
import re
from contextlib import asynccontextmanager
from typing import AsyncIterator

import anyio
import pytest

from subagents import InterruptResult
from subagents.store import inspect, read_controls, read_lease
from subagents.supervisor import Capabilities, ContinuableSpec, Provider, SubagentRequest, Supervisor, SupervisorConfig, UserAuthority

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
        [end] = _turn_ends(sup.store, child)
        assert (end["stop_reason"], end["cause"]) == ("interrupted", "user")
        assert re.fullmatch(r"the turn was cancelled \(user\); worker process \d+ killed by signal SIGKILL", end["diagnostic"]), end


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


@asynccontextmanager
async def _holder(tmp_path) -> AsyncIterator[Supervisor]:
    """The test's own Supervisor as the holder, its control files read only when the test says
    (``runtime.control.poll``): the interleaving of a request and the holder's turns is the test's."""
    cfg = SupervisorConfig(pool_size=1, durability="none", control_poll_s=3600)
    async with Supervisor.open(store=str(tmp_path / "st"), config=cfg) as sup:
        sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))
        yield sup


def _started(store, child: str) -> int:
    return sum(e["type"] == "turn/start" for e in _events(store, child))


@pytest.mark.parametrize("asked", ["while its turn ran", "while its turn was queued"])
async def test_a_request_the_holder_reads_after_the_turn_ended_stops_no_later_turn(hosts, tmp_path, asked) -> None:
    """The request names the turn the asker saw (running, or queued behind another child's turn on
    the only worker) and the holder reads it only once that turn completed and the child's next
    queued turn runs: that next turn is not stopped, and the answer says no turn was running."""
    gate_blocker, gate_first, gate_next = tmp_path / "blocker", tmp_path / "first", tmp_path / "next"
    async with _holder(tmp_path) as sup:
        root = await sup.open_root()
        if asked == "while its turn was queued":
            blocker, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=S({"hold": str(gate_blocker)}), label="b"))
            await poll(lambda: _started(sup.store, blocker) == 1, what="the blocker to take the worker")
        child, first = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=S({"hold": str(gate_first)}), label="c"))
        second = await sup.followup(root, child, S({"hold": str(gate_next)}, {"return": "second"}))
        if asked == "while its turn ran":
            await poll(lambda: _started(sup.store, child) == 1, what="the first turn to start")
        asker = hosts.start(tmp_path / "st")
        call = asker.send("interrupt", child=child, parent=root.id, wait_s=WAIT_S)
        await poll(lambda: read_controls(sup.store, child), what="the request to be durable")
        gate_blocker.touch()
        gate_first.touch()
        await poll(lambda: _started(sup.store, child) == 2, what="the next turn to start")
        await sup.runtime.control.poll()  # the holder reads the request only now
        answer = await anyio.to_thread.run_sync(asker.reply, call)
        gate_next.touch()
        await poll(lambda: len(_turn_ends(sup.store, child)) == 2, what="the next turn to end")
        assert [(e["stop_reason"], e.get("cause")) for e in _turn_ends(sup.store, child)] == [("completed", None), ("completed", None)]
        assert _message_of_turn(sup.store, child, 2) == second
        assert (answer["outcome"], answer["stop_reason"], answer["host"]) == ("no_turn_running", "completed", sup.runtime.owner_id), answer
        # the turn that ended is named either way: seen running by the asker, or found in the log after it
        assert (answer["turn"], answer["message_id"]) == (1, first), answer
        assert answer["detail"] == "its turn ended completed before the interrupt reached it"


async def test_a_request_read_while_the_turn_it_names_is_still_queued_stops_that_turn_only(hosts, tmp_path) -> None:
    """Read in time, the request for a turn queued behind another child's stops it before a worker
    takes it (its message discarded unrun) and says so; the child's next queued turn runs."""
    gate_blocker = tmp_path / "blocker"
    async with _holder(tmp_path) as sup:
        root = await sup.open_root()
        blocker, _ = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=S({"hold": str(gate_blocker)}), label="b"))
        await poll(lambda: _started(sup.store, blocker) == 1, what="the blocker to take the worker")
        child, first = await sup.start_continuable(ContinuableSpec(parent=root, provider="script", prompt=S({"return": "first"}), label="c"))
        second = await sup.followup(root, child, S({"return": "second"}))
        asker = hosts.start(tmp_path / "st")
        call = asker.send("interrupt", child=child, parent=root.id, wait_s=WAIT_S)
        await poll(lambda: read_controls(sup.store, child), what="the request to be durable")
        await sup.runtime.control.poll()
        answer = await anyio.to_thread.run_sync(asker.reply, call)
        assert (answer["outcome"], answer["turn"], answer["host"]) == ("cancelled", None, sup.runtime.owner_id), answer
        assert answer["detail"] == f"stopped by supervisor {sup.runtime.owner_id} (pid {os.getpid()}) before a worker took it"
        gate_blocker.touch()
        await poll(lambda: _turn_ends(sup.store, child), what="the next turn to end")
        events = _events(sup.store, child)
        assert [e["data"]["message_id"] for e in events if e["type"] == "message/discarded"] == [first]
        assert [e["data"]["stop_reason"] for e in events if e["type"] == "turn/end"] == ["completed"]
        assert _message_of_turn(sup.store, child, 1) == second


async def test_a_child_whose_closed_host_never_started_it_is_said_to_have_run_no_turn(tmp_path) -> None:
    """A one-shot child queued behind a busy worker when its host closed ran no turn (``not-started``):
    another process's interrupt says so, not that its last turn "ended not-started"."""
    store_path = str(tmp_path / "st")
    # no prefetch: the queued turn is never handed to the busy worker ahead, where the close would abort it
    config = SupervisorConfig(pool_size=1, worker_prefetch=0, durability="none")
    async with Supervisor.open(store=store_path, config=config) as host:
        host.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all()))
        root = await host.open_root(label="host")
        busy = await host.start("script", SubagentRequest(parent=root, prompt=S({"sleep": 60000}), label="busy"))
        queued = await host.start("script", SubagentRequest(parent=root, prompt=S({"return": "never"}), label="queued"))
        await poll(lambda: any(e["type"] == "turn/start" for e in _events(host.store, busy.id)))
    async with _asker(store_path) as asker:
        answer = await asker.interrupt(queued.id, authority=UserAuthority(root.id))
    assert answer.outcome == "no_turn_running"
    assert answer.detail == "no live supervisor holds it, and no turn of it has run"
