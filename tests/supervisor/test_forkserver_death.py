"""The forkserver of a running pool dies (the OOM killer, a stray ``kill -9``).

Every worker's sentinel is a pipe from the forkserver, so each reads as
dead at once though the workers still run. Was: the pool closed their pipes
while the event loop still had them registered, so every replacement's pipe
(same descriptor number) was never read again; the pool sat with no worker,
every later turn queued for ever, and its close hung.
"""

from __future__ import annotations

import os
import signal

import anyio
import pytest

from subagents.store import Store, inspect
from subagents.supervisor.pool import WorkerPool

from ..conftest import wait_until
from .test_pool import DEADLINE_S, echo_spec, no_rpc, script_spec, wait_started

pytestmark = pytest.mark.anyio


def _forkserver_pid() -> int:
    """This process's forkserver: its child whose command line names the forkserver module."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"forkserver" in cmdline:
            return int(entry)
    pytest.fail("no forkserver runs for this process")


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


async def test_a_pool_whose_forkserver_died_ends_its_turns_and_goes_on_with_new_workers(tmp_path) -> None:
    st = Store(tmp_path / "store", durability="none")
    pool = WorkerPool(size=1, start_method="forkserver", ready_timeout_s=DEADLINE_S, cancel_grace_s=1.0)
    results = []
    async with anyio.create_task_group() as tg:
        await pool.start(tg)
        [old] = pool.worker_pids()
        pool.submit(script_spec(st, "01ORPHANED", [{"sleep": 600_000}]), no_rpc, on_done=results.append)
        await wait_started(st, "01ORPHANED")
        os.kill(_forkserver_pid(), signal.SIGKILL)
        await wait_until(lambda: bool(results), what="the resident turn to end")
        [result] = results
        assert (result.outcome.stop_reason, result.crashed) == ("error", True)
        assert "forkserver" in (result.outcome.diagnostic or ""), result.outcome.diagnostic
        await wait_until(lambda: _gone(old), what=f"worker {old}, cut off from its forkserver, to be stopped")
        with anyio.fail_after(DEADLINE_S):
            handle = await pool.run_turn(echo_spec(st, "01AFTERFS"), no_rpc)
        assert (handle.outcome.stop_reason, handle.outcome.output) == ("completed", "hello"), handle.outcome.diagnostic
        assert handle.worker.pid != old
        assert [e["type"] for e in inspect(st, "01AFTERFS").events][-1] == "turn/end"
        with anyio.fail_after(DEADLINE_S):
            await pool.aclose()
        tg.cancel_scope.cancel()
