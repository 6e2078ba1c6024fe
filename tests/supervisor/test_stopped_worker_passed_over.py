"""A stopped worker (SIGSTOP, a debugger) is handed no new turn while another can take it; with every worker
stopped, a turn waits in the queue until one is continued.

Found by the edge probes: the pool handed the next turn to its least-loaded worker, stopped or not, and the
turn stalled there (a run that never ended) while the pool's other worker idled. The pool reads a worker's
process state only once it has said nothing for ``QUIET_S`` (a worker that just spoke is not taken for a
stopped one), so each test waits that long after stopping one: that is the case it is about, an idle
worker stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import anyio
import pytest

from subagents.supervisor import SubagentRequest
from subagents.supervisor.worker_stops import QUIET_S

from ..conftest import open_supervisor

pytestmark = pytest.mark.anyio


async def _run(sup, root: str, provider: str, *, within: float) -> str:
    run = await sup.start(provider, SubagentRequest(parent=root, prompt="go"))
    try:
        with anyio.fail_after(within):
            result = await run.result()
    finally:
        with anyio.CancelScope(shield=True):
            run.cancel("the test is over")
            await run.dispose()
    assert result.stop_reason == "completed", result
    return result.output


async def test_a_stopped_idle_worker_is_passed_over_for_one_that_runs(tmp_path: Path) -> None:
    async with open_supervisor(tmp_path, pool_size=2) as sup:
        root = await sup.open_root()
        first = int(await _run(sup, root, "pid", within=20))  # the first idle worker, which takes the next turn too
        os.kill(first, signal.SIGSTOP)
        try:
            await anyio.sleep(QUIET_S + 0.2)
            for _ in range(3):
                assert int(await _run(sup, root, "pid", within=10)) != first
        finally:
            with contextlib.suppress(ProcessLookupError):  # killed after a turn it stalled was cancelled
                os.kill(first, signal.SIGCONT)


async def test_with_every_worker_stopped_a_turn_waits_for_one_to_be_continued(tmp_path: Path) -> None:
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        root = await sup.open_root()
        only = int(await _run(sup, root, "pid", within=20))
        os.kill(only, signal.SIGSTOP)
        try:
            await anyio.sleep(QUIET_S + 0.2)
            run = await sup.start("pid", SubagentRequest(parent=root, prompt="go"))
            with anyio.move_on_after(1.0):
                await run.result()
            assert sup.statistics().pool.queued == 1 and sup.statistics().pool.resident == 0, sup.statistics().pool
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(only, signal.SIGCONT)
        with anyio.fail_after(10):
            result = await run.result()
        await run.dispose()
        assert (result.stop_reason, int(result.output)) == ("completed", only)
