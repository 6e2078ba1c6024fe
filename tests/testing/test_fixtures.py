"""The plugin's fixtures in the project's own run (issue 16): loaded by the entry point, no conftest.

Also the ``script`` actions written for test authors: a fixed amount of CPU work
(``cpu_iters``) and a gate (``hold``) the test opens by creating a file.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from subagents import SubagentRequest, Supervisor
from subagents.store import Store, read_lease
from subagents.testing import check_store

pytestmark = pytest.mark.anyio


def S(*actions: dict) -> str:
    return json.dumps({"script": list(actions)})


@pytest.mark.subagents(pool_size=1, durability="none")
async def test_the_marker_configures_the_supervisor(supervisor: Supervisor, subagents_store: Path) -> None:
    """Marker options reach ``SupervisorConfig``; the supervisor runs on the per-test store."""
    assert (supervisor.config.pool_size, supervisor.config.durability) == (1, "none")
    assert Path(supervisor.store.root) == subagents_store
    assert supervisor.providers() == ["script", "echo"]


async def test_the_default_supervisor(supervisor: Supervisor) -> None:
    assert (supervisor.config.pool_size, supervisor.config.durability) == (2, "batched")


async def test_a_root_runs_scripted_children(supervisor: Supervisor, subagents_root, subagents_store: Path) -> None:
    """A one-shot child doing a fixed amount of CPU work, then the store checks clean."""
    run = await supervisor.start("script", SubagentRequest(parent=subagents_root, prompt=S({"cpu_iters": 50_000}, {"return": "done"})))
    assert (await run.result()).output == "done"
    await run.dispose()
    assert read_lease(Store(subagents_store), subagents_root.id).state != "released", "the root is held while the test runs"
    report = check_store(subagents_store)
    assert report.clean and report.counts.sessions == 2, str(report)


@pytest.mark.subagents(pool_size=1, durability="none")
async def test_hold_waits_for_its_gate(supervisor: Supervisor, subagents_root, tmp_path: Path) -> None:
    """``{"hold": path}`` keeps the turn running until the file exists."""
    gate = tmp_path / "gate"
    run = await supervisor.start("script", SubagentRequest(parent=subagents_root, prompt=S({"hold": str(gate)}, {"return": "through"})))
    with anyio.move_on_after(0.3):
        await run.result()
    assert not run.done, "the turn ended before its gate opened"
    gate.touch()
    with anyio.fail_after(20):
        assert (await run.result()).output == "through"
    await run.dispose()


@pytest.mark.subagents(pool_size=1, durability="none")
async def test_cpu_iters_stops_when_cancelled(supervisor: Supervisor, subagents_root) -> None:
    """A long ``cpu_iters`` checks cancellation: a timeout ends it ``budget-exhausted`` promptly."""
    from subagents import RunBudget

    request = SubagentRequest(parent=subagents_root, prompt=S({"cpu_iters": 10**12}), budget=RunBudget(timeout_ms=200))
    run = await supervisor.start("script", request)
    with anyio.fail_after(20):
        result = await run.result()
    assert result.stop_reason == "budget-exhausted"
    await run.dispose()


def test_the_shared_store_lives_in_the_runs_temp_folder(shared_subagents_store: Path, tmp_path_factory, request) -> None:
    """In the run's temp folder, or under xdist in the folder every worker's temp folder shares."""
    base = tmp_path_factory.getbasetemp()
    folder = base.parent if hasattr(request.config, "workerinput") else base
    assert shared_subagents_store == folder / "subagents-shared-store"
    assert (shared_subagents_store / "STORE").exists()
