"""CPU-heavy children really run in different worker processes (speed is measured by the benchmark)."""

from __future__ import annotations

import anyio
import pytest

from subagents.supervisor import SubagentRequest

from ..conftest import open_supervisor

pytestmark = pytest.mark.anyio


async def run_cpu_children(sup, count: int, ms: int) -> list[int]:
    root = await sup.open_root()
    runs = [await sup.start("cpu-pid", SubagentRequest(parent=root, prompt=str(ms))) for _ in range(count)]
    pids = []
    with anyio.fail_after(20):
        for run in runs:
            result = await run.result()
            assert result.stop_reason == "completed"
            pids.append(int(result.output))
            await run.dispose()
    return pids


async def test_two_cpu_children_use_two_workers(tmp_path):
    async with open_supervisor(tmp_path, pool_size=2) as sup:
        workers = set(sup.pool.worker_pids())
        pids = await run_cpu_children(sup, 2, 400)
        assert len(set(pids)) == 2
        assert set(pids) == workers


async def test_one_worker_runs_children_in_turn(tmp_path):
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        [worker] = sup.pool.worker_pids()
        pids = await run_cpu_children(sup, 2, 50)
        assert pids == [worker, worker]


async def test_pool_statistics_at_rest(tmp_path):
    async with open_supervisor(tmp_path, pool_size=2) as sup:
        stats = sup.statistics().pool
        assert (stats.size, stats.workers_alive, stats.queued, stats.resident, stats.parked, stats.started, stats.crashed) == (2, 2, 0, 0, 0, 2, 0)
        assert len(set(sup.pool.worker_pids())) == 2
