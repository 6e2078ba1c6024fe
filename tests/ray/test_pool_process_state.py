"""What a program leaves in its worker's process does not outlast the worker's turns, on either pool.

The local pool's workers take their working folder back when no turn is left in them, and end the
processes a program started when they exit (``tests/supervisor/test_working_folder.py``,
``tests/supervisor/test_program_processes.py``). A Ray actor did not take its folder back (found by a
review of the two pools side by side): a program's ``os.chdir`` followed every later turn the actor ran,
another agent's among them. The processes a program leaves running as it ends its actor with ``sys.exit``
(a shell's child too) end there as well; pinned here for both pools.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import pytest

from subagents.supervisor import Capabilities, Provider, SubagentRequest

from ..conftest import DEADLINE_S, HELPERS, said, still_running
from ._pools import open_pool_supervisor
from .conftest import RAY_TESTS

pytestmark = [pytest.mark.anyio, *RAY_TESTS]


def _kill_sleeps(pids: list[int]) -> None:
    """Cleanup: a ``sleep`` or shell the test's program started and the runtime left running."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if not handle.read().startswith((b"sleep", b"sh")):
                    continue  # the pid is no longer ours
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


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
        _kill_sleeps(started)
