"""A worker stopped mid-turn (SIGSTOP, Ctrl-Z): ``show`` and ``top`` say so beside its node, and an interrupt still
ends the turn, the worker killed after the cancel grace.

Found by a probe of misbehaving programs: the turn of a stopped worker read as one running long (``running``,
its time growing), with nothing to tell it from a slow program.
"""

from __future__ import annotations

import os
import signal
from functools import partial

import anyio
import pytest

from subagents.supervisor import SubagentRequest, UserAuthority

from ..conftest import DEADLINE_S, open_supervisor, said, wait_until
from .test_cli_operate import run_cli

pytestmark = pytest.mark.anyio


async def test_show_and_top_say_a_worker_is_stopped_and_an_interrupt_still_ends_its_turn(tmp_path) -> None:
    async with open_supervisor(tmp_path, pool_size=1, cancel_grace_s=0.3) as sup:
        root = await sup.open_root()
        run = await sup.start("pid-then-sleep", SubagentRequest(parent=root, prompt="60000"))
        worker = int((await wait_until(lambda: said(sup.store, run.id), what="the worker's pid"))[0])
        os.kill(worker, signal.SIGSTOP)
        try:
            printed = {}

            async def cli(*args: str) -> None:
                printed[args[0]] = await anyio.to_thread.run_sync(partial(run_cli, sup.store, *args))

            async with anyio.create_task_group() as both:  # side by side: each is a new interpreter
                both.start_soon(cli, "show", run.id)
                both.start_soon(cli, "top", "--once")
            shown, top = printed["show"], printed["top"]
            assert f":{worker} (stopped: its turn stalls until `kill -CONT {worker}`" in shown.stdout, shown
            assert f":{worker} (stopped)" in top.stdout, top
            outcome = await sup.interrupt(run.id, authority=UserAuthority(parent_session=root.id))
            assert outcome.outcome == "cancelled"
            with anyio.fail_after(DEADLINE_S):
                result = await run.result()
            assert result.stop_reason == "aborted" and f"worker process {worker} killed by signal SIGKILL" in result.diagnostic
            await run.dispose()
        finally:
            try:
                os.kill(worker, signal.SIGCONT)
            except ProcessLookupError:
                pass
