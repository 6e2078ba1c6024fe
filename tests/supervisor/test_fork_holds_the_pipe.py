"""A worker killed from outside (``kill -9``, the kernel's OOM killer) while a process its program forked holds
copies of its descriptors: its turn ends at once, ``error`` naming the signal.

Found by a probe of misbehaving programs: the fork kept the worker's end of its pipe open, so the pool read the
worker's death (its sentinel) beside an open pipe as the death of the forkserver, logged "the forkserver died;
worker N goes on", and waited for that pipe's end: the turn never ended, its run's ``dispose`` hung, and so did
the supervisor's close.
"""

from __future__ import annotations

import os
import signal

import anyio
import pytest

from subagents.supervisor import Provider, SubagentRequest

from ..conftest import DEADLINE_S, HELPERS, open_supervisor, said, wait_until

pytestmark = pytest.mark.anyio


async def test_a_worker_killed_while_its_fork_holds_its_pipe_ends_its_turn(tmp_path) -> None:
    forked = 0
    try:
        async with open_supervisor(tmp_path, pool_size=1) as sup:
            sup.register_provider(Provider(name="forks", program=f"{HELPERS}:forks_a_lingering_child"))
            root = await sup.open_root()
            run = await sup.start("forks", SubagentRequest(parent=root, prompt="go"))
            worker, forked = (int(pid) for pid in (await wait_until(lambda: said(sup.store, run.id), what="the pids"))[0].split())
            os.kill(worker, signal.SIGKILL)
            with anyio.fail_after(10):
                result = await run.result()
            assert result.stop_reason == "error" and f"worker process {worker} killed by signal SIGKILL" in result.diagnostic, result
            await run.dispose()
            echo = await sup.start("echo", SubagentRequest(parent=root, prompt="next"))  # a replacement serves
            with anyio.fail_after(DEADLINE_S):
                assert (await echo.result()).stop_reason == "completed"
            await echo.dispose()
    finally:
        if forked:
            try:
                os.kill(forked, signal.SIGKILL)
            except ProcessLookupError:
                pass
