"""A program's ``os.chdir`` does not follow the turns after it on its worker: a worker with no turn left takes its
working folder back.

Found by a probe of misbehaving programs: a program that changed folder and returned left its worker there, and
the next child that worker ran (another agent's turn, whatever its program) read and wrote its relative paths
in that folder.
"""

from __future__ import annotations

import os

import anyio
import pytest

from subagents.supervisor import Provider, SubagentRequest

from ..conftest import DEADLINE_S, HELPERS, open_supervisor

pytestmark = pytest.mark.anyio


async def test_the_next_turn_on_a_worker_starts_in_its_working_folder_whatever_the_last_program_did(tmp_path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    async with open_supervisor(tmp_path, pool_size=1) as sup:
        sup.register_provider(Provider(name="changes", program=f"{HELPERS}:changes_folder"))
        sup.register_provider(Provider(name="folder", program=f"{HELPERS}:working_folder"))
        root = await sup.open_root()
        outputs = []
        for provider, prompt in (("folder", "-"), ("changes", str(elsewhere)), ("folder", "-")):
            run = await sup.start(provider, SubagentRequest(parent=root, prompt=prompt))
            with anyio.fail_after(DEADLINE_S):
                outputs.append((await run.result()).output)
            await run.dispose()
        assert outputs == [os.getcwd(), str(elsewhere), os.getcwd()]
