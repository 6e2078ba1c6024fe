"""Concurrent follow-ups to a cold child materialise ONE activation (found by ``check_store``, issue 16).

Two deliveries that both found the child without an activation each took its
lease; the second one then saw the first one's activation and gave up — but its
acquisition had already raised the epoch (a lease held by the same owner is
re-acquired at ``epoch + 1``), fencing the live activation. Its turns stopped,
its messages stayed pending, and the lease stayed held after the supervisor
closed (``lease-expired``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Callable

import anyio
import pytest

from subagents.store import check_store, inspect, read_lease
from subagents.supervisor.continuable import materialization
from subagents.supervisor.continuable.delivery import Delivery

from ..conftest import REPO_ROOT
from .test_continuable import S, continuable_supervisor, settled, start, turn_ends

pytestmark = pytest.mark.anyio


async def four_followups_resume_once(tmp_path, root_id: str, child: str) -> None:
    """Four concurrent followups to the cold ``child`` in a new supervisor: all run at the first
    resume's epoch (one acquisition), the lease is released on close, the store checks clean."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root(id=root_id)
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(sup.followup, root, child, S({"return": f"again {i}"}))
        with anyio.fail_after(30):
            while len(turn_ends(sup.store, child)) < 5:
                await anyio.sleep(0.01)
        assert read_lease(sup.store, child).epoch == 2, "one resume, one acquisition"
    assert turn_ends(sup.store, child) == ["completed"] * 5
    report = check_store(sup.store.root)
    assert report.clean, str(report)


async def test_concurrent_followups_to_a_cold_child(tmp_path) -> None:
    """Both messages run at the first resume's epoch; the lease is released on close; the store checks clean."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root(label="main")
        child, _ = await start(sup, root, S({"return": "first"}))
        await settled(sup, root, child)
    await four_followups_resume_once(tmp_path, root.id, child)


async def test_followups_still_routing_keep_the_resumed_child_from_settling(tmp_path, monkeypatch) -> None:
    """Three of four concurrent followups are slow to find the child (their routing read waits until
    the first one's resume has run its turn, then gives it room to settle): the resumed activation
    waits for them instead of settling, so all four run in that one activation (a settled one was
    resumed again, at epoch 3 and more, when a loaded machine delayed the routing the same way)."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root(label="main")
        child, _ = await start(sup, root, S({"return": "first"}))
        await settled(sup, root, child)
        st = sup.store
    real = Delivery.held_elsewhere
    routed = 0
    lock = threading.Lock()

    def slow_after_the_first(delivery: Delivery, child_id: str) -> bool:
        nonlocal routed
        with lock:
            routed += 1
            first = routed == 1
        if not first:
            deadline = time.monotonic() + 30
            while len(turn_ends(st, child_id)) < 2 and time.monotonic() < deadline:
                time.sleep(0.005)  # a poll interval: waits for the resumed turn to end
            room = time.monotonic() + 0.5  # room for a settlement that does not wait (the bug this pins)
            while read_lease(st, child_id).state != "released" and time.monotonic() < room:
                time.sleep(0.005)
        return real(delivery, child_id)

    monkeypatch.setattr(Delivery, "held_elsewhere", slow_after_the_first)
    await four_followups_resume_once(tmp_path, root.id, child)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    env.update(PYTHONPATH=REPO_ROOT, SUBAGENTS_DURABILITY="none", SUBAGENTS_POOL_SIZE="1", SUBAGENTS_CONTROL_POLL_S="0.02")
    return env


def _started(store, child: str) -> list[str]:
    """The message ids of the child's turns, in the order they started."""
    return [e["data"]["message_id"] for e in inspect(store, child).events if e["type"] == "turn/start"]


def _in_the_resume_gap(monkeypatch, move: Callable[[], None]) -> None:
    """Make ``move`` (another supervisor's) happen in the gap a cold resume leaves between its read of the
    child's log and its acquisition of the lease: once, before the first acquisition."""
    real = materialization.acquire_lease
    moved: list[bool] = []

    def acquire_after_the_move(*args, **kwargs):
        if not moved:
            moved.append(True)
            move()
        return real(*args, **kwargs)

    monkeypatch.setattr(materialization, "acquire_lease", acquire_after_the_move)


async def test_a_resume_that_another_supervisor_ran_a_turn_under_starts_from_that_turn(tmp_path, monkeypatch) -> None:
    """Found by a probe: a cold resume read the child's log, then took its lease. When another supervisor
    resumed the child in between, ran a message and let it go, the new activation's cursor came from the
    older read: it ran that message again (``message-duplicated``), and the child's mailbox and log never
    agreed again (every later message refused, ``CORRUPT_SESSION``). Here the other supervisor (a
    ``subagents send`` in another process) runs its message exactly in that gap; the resume takes the
    cursor from the log as it is once the lease is its own."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root(label="main")
        child, _ = await start(sup, root, S({"return": "first"}))
        await settled(sup, root, child)
        sent: list[subprocess.CompletedProcess[str]] = []
        _in_the_resume_gap(monkeypatch, lambda: sent.append(subprocess.run(  # resumes the child, runs one message, settles
            [sys.executable, "-m", "subagents.supervisor.cli", "--store", sup.store.root, "send", child, S({"return": "from the other"}),
             "--parent", root.id], cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=60)))
        await sup.followup(root, child, S({"return": "from here"}))
        with anyio.fail_after(30):
            while len(turn_ends(sup.store, child)) < 3:
                await anyio.sleep(0.01)
            await anyio.sleep(0.3)  # room for a duplicate turn to show
        assert sent[0].returncode == 0, sent[0].stderr
        started = _started(sup.store, child)
        assert len(started) == len(set(started)) == 3, started  # first, the other's, ours: each once
        assert check_store(sup.store.root).clean


HOLDER = """
import json, sys, anyio
from subagents.supervisor import *

async def main(store, root, child):
    cfg = SupervisorConfig(pool_size=1, durability="none", control_poll_s=0.02)
    async with Supervisor.open(store=store, config=cfg) as sup:
        sup.register_provider(Provider(name="script", program="script", capabilities=Capabilities.all(), continuable=True))
        await sup.send(child, json.dumps({"script": [{"sleep": 500}, {"return": "the holder's"}]}), parent=root)
        await anyio.sleep(3600)

anyio.run(main, *sys.argv[1:4])
"""


async def test_a_followup_that_loses_the_resume_race_goes_to_the_winner(tmp_path, monkeypatch) -> None:
    """Found by a probe: a followup that saw the child free, then lost its lease to another supervisor's
    resume, failed with NOT_RESUMABLE "it is active in another supervisor" (nothing was accepted, but a
    valid call failed). It is routed to the winner's mailbox, as when the child was held from the start."""
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root(label="main")
        child, _ = await start(sup, root, S({"return": "first"}))
        await settled(sup, root, child)
        holders: list[subprocess.Popen[str]] = []

        def another_supervisor_takes_it() -> None:
            holders.append(subprocess.Popen([sys.executable, "-c", HOLDER, sup.store.root, root.id, child], env=_env(), cwd=REPO_ROOT,
                                            text=True, stdout=subprocess.DEVNULL))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                lease = read_lease(sup.store, child)
                if lease is not None and lease.state != "released" and lease.owner != sup.statistics().owner_id:
                    return
                time.sleep(0.01)

        _in_the_resume_gap(monkeypatch, another_supervisor_takes_it)
        try:
            ours = await sup.followup(root, child, S({"return": "ours"}))
            with anyio.fail_after(30):
                while ours not in _started(sup.store, child):
                    await anyio.sleep(0.02)
        finally:
            for holder in holders:
                holder.kill()
                holder.wait(10)
        started = _started(sup.store, child)
        assert started.count(ours) == 1 and len(started) == len(set(started)) == 3, started
