"""A followup to a child that ``store fsck --repair`` holds for the moment runs once fsck lets go.

fsck takes a child's lease while it cuts a torn tail or releases an abandoned
lease. A ``send`` at that moment took fsck for a hosting supervisor: the
message was accepted and acknowledged, then nobody ran it (it stayed pending
until a later ``send`` or ``resume_pending``). A maintenance owner says so in
its record, and delivery waits it out instead.
"""

from __future__ import annotations

import anyio
import pytest

from subagents.store import acquire_lease, check_store, maintenance_owner, read_owner, release_lease

from ..conftest import said
from .test_continuable import S, continuable_supervisor, settled, start, turn_ends
from .test_drain import discarded, left_by_a_closed_host

pytestmark = pytest.mark.anyio


async def _settled_child(tmp_path) -> tuple[str, str]:
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root(label="main")
        child, _ = await start(sup, root, S({"return": "first"}))
        await settled(sup, root, child)
    return root.id, child


async def test_a_followup_while_fsck_holds_the_child_runs_once_fsck_lets_go(tmp_path) -> None:
    root_id, child = await _settled_child(tmp_path)
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root(id=root_id)
        with maintenance_owner(sup.store, ttl=30.0) as owner_id:  # as fsck --repair holds a lease
            taken = acquire_lease(sup.store, child, owner_id)
            async with anyio.create_task_group() as tg:
                tg.start_soon(sup.followup, root, child, S({"return": "second"}))
                await anyio.sleep(0.3)
                assert turn_ends(sup.store, child) == ["completed"], "nothing runs under fsck's lease"
                release_lease(sup.store, child, owner_id, taken.epoch)
        with anyio.fail_after(30):
            while len(turn_ends(sup.store, child)) < 2:
                await anyio.sleep(0.02)
        await settled(sup, root, child)
    assert turn_ends(sup.store, child) == ["completed", "completed"]
    report = check_store(sup.store.root)
    assert report.clean, str(report)


def test_a_maintenance_owner_says_so_in_its_record_and_a_host_does_not(tmp_path) -> None:
    from subagents.store import Store, new_id, register_owner

    store = Store(str(tmp_path / "store"))
    host = register_owner(store, new_id(), ttl=30.0)
    assert read_owner(store, host.owner_id).maintenance is False
    with maintenance_owner(store, ttl=30.0) as owner_id:
        assert read_owner(store, owner_id).maintenance is True
    assert read_owner(store, owner_id) is None, "its record is removed when it is done"


async def test_a_drain_while_fsck_holds_a_child_nobody_hosts_drains_it_once_fsck_lets_go(tmp_path) -> None:
    """A drain took fsck for the child's host: it wrote a drain request nobody would carry out and
    left the child's queued messages pending, so the next ``resume_pending`` ran the drained work."""
    root_id, running, queued, _done = await left_by_a_closed_host(tmp_path)
    async with continuable_supervisor(tmp_path) as sup:
        root = await sup.open_root(id=root_id)
        with maintenance_owner(sup.store, ttl=30.0) as owner_id:
            taken = acquire_lease(sup.store, running, owner_id)
            async with anyio.create_task_group() as tg:
                tg.start_soon(sup.drain_children, root, [running])
                await anyio.sleep(0.3)
                release_lease(sup.store, running, owner_id, taken.epoch)
        assert discarded(sup.store, running) == [queued]
        assert await sup.resume_pending(root) == []
        assert said(sup.store, running) == ["awake"]
