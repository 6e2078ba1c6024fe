"""The lease keeper's answer to "can a lease of mine have been taken over since?" without a store read."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import anyio
import pytest

from subagents.store import IdGenerator, Store, read_owner
from subagents.supervisor.lease_keeper import LeaseKeeper

from .test_cli_control import REPO, cli_env

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



OPEN_THEN_SAY = """
import json, os, sys, time, anyio
from subagents.store import read_owner
from subagents.supervisor import Supervisor, SupervisorConfig

def started_at(pid):
    # when pid started, in wall-clock seconds (to the kernel's tick, rounded down); /proc/stat's
    # btime is whole seconds, too coarse: the boot's wall time is read off the two clocks instead
    boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    with open(f"/proc/{pid}/stat") as handle:
        ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
    return boot + ticks / os.sysconf("SC_CLK_TCK")

async def main(store):
    # a long TTL: no renewal falls in the window this test looks at
    async with Supervisor.open(store=store, config=SupervisorConfig(pool_size=1, durability="none", lease_ttl_s=60)) as sup:
        owner = read_owner(sup.store, sup.statistics().owner_id)
        workers = [started_at(pid) for pid in sup.pool.worker_pids()]
        print(json.dumps({"heartbeat_at": owner.heartbeat_at, "workers_started_at": workers}), flush=True)

anyio.run(main, sys.argv[1])
"""


def test_a_supervisor_is_not_alive_to_others_before_its_workers_are(tmp_path) -> None:
    """The owner record is written once the pool has started: the first worker start (the forkserver's
    imports) blocks the event loop, on a busy host for seconds, and a heartbeat written before it was
    that old when ``open`` returned; past the TTL, other processes read the supervisor as dead and took
    the children it had just resumed, mid-turn (found by a probe: 8 ``subagents send`` at once)."""
    done = subprocess.run([sys.executable, "-c", OPEN_THEN_SAY, str(tmp_path / "store")], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["workers_started_at"]
    assert said["heartbeat_at"] >= max(said["workers_started_at"]), said
