"""What a program leaves in its worker's process does not outlast the worker's turns, on either pool.

A worker with no turn left takes its working folder back: a program's ``os.chdir`` followed every later
turn on its worker, another agent's among them (found on the local pool by a probe of misbehaving
programs, then on Ray by a review of the two pools side by side). The processes a program leaves running
as it ends its worker with ``sys.exit`` (a shell's child too) end with the worker; the other ways a
worker ends are in ``tests/supervisor/test_program_processes.py``.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from subagents.supervisor import Capabilities, Provider, SubagentRequest

from ..conftest import DEADLINE_S, HELPERS, kill_leftover_sleeps, said, still_running
from ._pools import open_pool_supervisor
from .conftest import RAY_TESTS

pytestmark = [pytest.mark.anyio, *RAY_TESTS]


async def test_the_next_turn_on_a_worker_starts_in_the_folder_the_worker_started_in(tmp_path: Path, kind: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    async with open_pool_supervisor(tmp_path, kind, pool_size=1) as sup:
        caps = Capabilities.all()
        sup.register_provider(Provider(name="changes", program=f"{HELPERS}:changes_folder", capabilities=caps))
        sup.register_provider(Provider(name="folder", program=f"{HELPERS}:working_folder", capabilities=caps))
        root = await sup.open_root()
        outputs = []
        for provider, prompt in (("folder", "-"), ("changes", str(elsewhere)), ("folder", "-")):
            run = await sup.start(provider, SubagentRequest(parent=root, prompt=prompt))
            with anyio.fail_after(DEADLINE_S):
                result = await run.result()
            assert result.stop_reason == "completed", result
            outputs.append(result.output)
            await run.dispose()
        home = outputs[0]
        assert home != str(elsewhere)
        assert outputs == [home, str(elsewhere), home]


@pytest.mark.parametrize("program", ["starts_a_process_and_exits", "starts_a_process_tree_and_exits"])
async def test_processes_left_running_end_when_their_program_exits_the_worker(tmp_path: Path, kind: str, program: str) -> None:
    started: list[int] = []
    try:
        async with open_pool_supervisor(tmp_path, kind, pool_size=1) as sup:
            sup.register_provider(Provider(name="exits", program=f"{HELPERS}:{program}", capabilities=Capabilities.all()))
            root = await sup.open_root()
            run = await sup.start("exits", SubagentRequest(parent=root, prompt="go"))
            with anyio.fail_after(DEADLINE_S):
                result = await run.result()
            started = [int(pid) for pid in said(sup.store, run.id)[0].split()]
            assert len(started) == (2 if program.endswith("tree_and_exits") else 1), started
            assert result.stop_reason == "error", result
            assert not still_running(started), "left running after its program's sys.exit ended the worker"
            await run.dispose()
    finally:
        kill_leftover_sleeps(started)
