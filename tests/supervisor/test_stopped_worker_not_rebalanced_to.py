"""A turn waiting ahead (prefetch) is asked back only for another worker that takes turns now: not for a
stopped one's free slot, nor, behind a long turn, when no other worker could run it sooner.

Found by a probe (a pool of two, one worker SIGSTOP'd while idle, turns of 400 ms on the other): every turn
handed ahead to the worker that ran was asked back at once, for the stopped worker's free slot (or, once the
re-check for the stopped worker came 0.25 s later, as one waiting too long), then waited in the pool's queue
for that same worker, with prefetch off behind it: 3 withdrawals for 4 turns, a ``Withdraw`` and a
``Withdrawn`` on the pipe each, and a round trip at the end of each running turn that prefetch exists to
save. A pool of one asked its turns ahead back the same way. No loop: a turn given back is never handed ahead
again. Once the stopped worker is continued, a turn waiting ahead is asked back for it as before.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import AsyncIterator

import anyio
import pytest

from subagents.store import Store
from subagents.supervisor.dispatch import AHEAD_WAIT_S
from subagents.supervisor.pool import WorkerPool
from subagents.supervisor.worker_stops import QUIET_S, RECHECK_S

from ..conftest import wait_until
from .test_pool import DEADLINE_S, Submitted, echo_spec, held_spec, wait_started

pytestmark = pytest.mark.anyio


@pytest.fixture
def st(tmp_path) -> Store:
    return Store(tmp_path / "store", durability="none")


@contextlib.asynccontextmanager
async def started_pool(size: int, prefetch: int) -> AsyncIterator[WorkerPool]:
    """A running pool, closed however the test ends (a failed assertion left its tasks running, and the test hung)."""
    pool = WorkerPool(size=size, start_method="forkserver", ready_timeout_s=DEADLINE_S, cancel_grace_s=1.0, prefetch=prefetch)
    async with anyio.create_task_group() as tg:
        await pool.start(tg)
        try:
            yield pool
        finally:
            with anyio.CancelScope(shield=True):
                await pool.aclose()
            tg.cancel_scope.cancel()


async def test_a_stopped_workers_free_slot_takes_no_turn_back_until_it_is_continued(st, tmp_path):
    gate = tmp_path / "gate"
    async with started_pool(2, 1) as pool:
        stopped, running = pool.worker_pids()  # the first takes a turn on a tie: stopped, it is passed over
        os.kill(stopped, signal.SIGSTOP)
        try:
            await anyio.sleep(QUIET_S + 0.2)
            submit = Submitted(pool)
            results = submit.results
            submit("held", held_spec(st, "01HELD", gate))
            submit("ahead", echo_spec(st, "01AHEAD", "next"))  # ahead, behind the held turn
            await wait_started(st, "01HELD")
            await anyio.sleep(4 * RECHECK_S + AHEAD_WAIT_S)  # the re-checks for the stopped worker, and the aging
            stats = pool.statistics()
            assert (stats.withdrawn, stats.ahead) == (0, 1), stats
            assert results == {}
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
        await wait_until(lambda: "ahead" in results, what="the turn ahead to run on the continued worker")
        assert (results["ahead"].outcome.output, results["ahead"].worker.pid) == ("next", stopped)
        assert "held" not in results and pool.statistics().withdrawn == 1
        gate.touch()
        await wait_until(lambda: "held" in results, what="the held turn to end")
        assert results["held"].worker.pid == running


async def test_in_a_pool_of_one_a_turn_ahead_of_a_long_turn_stays_where_it_waits(st, tmp_path):
    gate = tmp_path / "gate"
    async with started_pool(1, 2) as pool:
        submit = Submitted(pool)
        results = submit.results
        submit("held", held_spec(st, "01HELD", gate))
        submit("ahead", echo_spec(st, "01AHEAD", "next"))
        await wait_started(st, "01HELD")
        await anyio.sleep(AHEAD_WAIT_S * 2)  # aged
        submit("later", echo_spec(st, "01LATER", "later"))  # a dispatch pass, which asks aged turns back
        await anyio.sleep(0.3)
        stats = pool.statistics()
        assert (stats.withdrawn, stats.ahead) == (0, 2), stats
        gate.touch()
        await wait_until(lambda: len(results) == 3, what="3 turns to end")
        assert [r.outcome.output for r in (results["ahead"], results["later"])] == ["next", "later"]
