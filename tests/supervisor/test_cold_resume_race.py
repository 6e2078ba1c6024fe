"""Concurrent follow-ups to a cold child materialise ONE activation (found by ``check_store``, issue 16).

Two deliveries that both found the child without an activation each took its
lease; the second one then saw the first one's activation and gave up — but its
acquisition had already raised the epoch (a lease held by the same owner is
re-acquired at ``epoch + 1``), fencing the live activation. Its turns stopped,
its messages stayed pending, and the lease stayed held after the supervisor
closed (``lease-expired``).
"""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from subagents.store import check_store, read_lease
from subagents.supervisor.continuable.delivery import Delivery

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
