"""The lease keeper's answer to "can a lease of mine have been taken over since?" without a store read."""

from __future__ import annotations

import time

import anyio
import pytest

from subagents.store import IdGenerator, Store, read_owner
from subagents.supervisor.lease_keeper import LeaseKeeper

TTL = 0.6


def test_a_fresh_renewal_holds_the_leases_of_its_streak(tmp_path) -> None:
    keeper = LeaseKeeper(Store(str(tmp_path / "store")), ttl_s=TTL, ids=IdGenerator())
    keeper.start()
    streak = keeper.streak()
    assert keeper.held_surely(streak)
    assert not keeper.held_surely(streak + 1)  # a streak that has not begun holds nothing
    keeper.stop()


def test_a_renewal_grown_old_holds_nothing(tmp_path) -> None:
    """No beat for most of the TTL (the loop not running: a paused process): not known, the caller reads."""
    keeper = LeaseKeeper(Store(str(tmp_path / "store")), ttl_s=TTL, ids=IdGenerator())
    keeper.start()
    streak = keeper.streak()
    time.sleep(TTL * 0.7)
    assert not keeper.held_surely(streak)
    keeper.stop()


@pytest.mark.anyio
async def test_a_gap_between_renewals_ends_the_streak_for_good(tmp_path) -> None:
    """After a pause, the next renewal makes the heartbeat fresh again, but a lease taken before the pause
    may have been taken over during it: its streak never holds again; a lease taken after does."""
    store = Store(str(tmp_path / "store"))
    keeper = LeaseKeeper(store, ttl_s=TTL, ids=IdGenerator())
    keeper.start()
    before_pause = keeper.streak()
    time.sleep(TTL * 1.1)  # past the TTL: another supervisor could take every lease
    async with anyio.create_task_group() as tg:
        tg.start_soon(keeper.run)
        with anyio.fail_after(10):
            while keeper.statistics().heartbeats == 0:
                await anyio.sleep(0.01)
        after_pause = keeper.streak()
        assert after_pause != before_pause
        assert keeper.held_surely(after_pause) and not keeper.held_surely(before_pause)
        await anyio.sleep(TTL * 1.5)  # beats every TTL/3 keep the new streak
        assert keeper.held_surely(after_pause)
        assert keeper.streak() == after_pause
        tg.cancel_scope.cancel()
    assert read_owner(store, keeper.owner_id) is not None
    keeper.stop()
