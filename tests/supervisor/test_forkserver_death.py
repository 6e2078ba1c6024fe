"""The forkserver of a running pool dies (the OOM killer, a stray ``kill -9``).

Every worker's sentinel is a pipe from the forkserver, so each reads as
dead at once though the workers still run. Was: each counted as "exited with
code 255", its turn ended ``error``, and the pool closed its pipe
while the event loop still had them registered, so every replacement's pipe
(same descriptor number) was never read again; the pool sat with no worker,
every later turn queued for ever, and its close hung.
"""

from __future__ import annotations

import os
import signal
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import anyio
import pytest

from subagents.store import Store
from subagents.supervisor.pool import WorkerPool

from ..conftest import wait_until
from .test_pool import DEADLINE_S, echo_spec, no_rpc, script_spec, wait_started

pytestmark = pytest.mark.anyio


def forkserver_of(pid: int) -> int | None:
    """The forkserver ``pid`` started: its child whose command line names the forkserver module."""
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
        if ppid == pid and b"forkserver" in cmdline:
            return int(entry)
    return None


def _forkserver_pid() -> int:
    pid = forkserver_of(os.getpid())
    if pid is None:
        pytest.fail("no forkserver runs for this process")
    return pid


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie counts: only its parent can reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


@asynccontextmanager
async def _orphaned_while_running(st: Store, session_id: str, script: list, results: list) -> AsyncIterator[tuple[Any, WorkerPool, int]]:
    """A one-worker pool whose forkserver is killed while the worker runs ``script``: its task group, the pool, the worker's pid."""
    pool = WorkerPool(size=1, start_method="forkserver", ready_timeout_s=DEADLINE_S, cancel_grace_s=1.0)
    async with anyio.create_task_group() as tg:
        await pool.start(tg)
        [old] = pool.worker_pids()
        pool.submit(script_spec(st, session_id, script), no_rpc, on_done=results.append)
        await wait_started(st, session_id)
        os.kill(_forkserver_pid(), signal.SIGKILL)
        yield tg, pool, old


async def test_workers_outlive_their_forkserver_and_a_later_death_is_still_seen(tmp_path) -> None:
    """The workers still run when their forkserver dies: the turn under way completes, the next runs on
    the same worker, and a later death of that worker (now seen through its pipe) ends its turn ``error``
    and a replacement (from a new forkserver) serves the turn after."""
    st = Store(tmp_path / "store", durability="none")
    results = []
    async with _orphaned_while_running(st, "01UNDERWAY", [{"sleep": 1500}, {"return": "done"}], results) as (tg, pool, old):
        await wait_until(lambda: bool(results), what="the turn under way to end")
        assert (results[0].outcome.stop_reason, results[0].outcome.output, results[0].crashed) == ("completed", "done", False)
        with anyio.fail_after(DEADLINE_S):
            handle = await pool.run_turn(echo_spec(st, "01SAMEWORKER"), no_rpc)
        assert (handle.outcome.stop_reason, handle.worker.pid) == ("completed", old), handle.outcome.diagnostic

        pool.submit(script_spec(st, "01KILLEDLATER", [{"sleep": 600_000}]), no_rpc, on_done=results.append)
        await wait_started(st, "01KILLEDLATER")
        os.kill(old, signal.SIGKILL)
        await wait_until(lambda: len(results) == 2, what="the killed worker's turn to end")
        assert (results[1].outcome.stop_reason, results[1].crashed) == ("error", True)
        assert "exit status was lost" in (results[1].outcome.diagnostic or ""), results[1].outcome.diagnostic
        with anyio.fail_after(DEADLINE_S):
            handle = await pool.run_turn(echo_spec(st, "01AFTERFS"), no_rpc)
        assert (handle.outcome.stop_reason, handle.outcome.output) == ("completed", "hello"), handle.outcome.diagnostic
        assert handle.worker.pid != old
        assert pool.statistics().crashed == 1
        with anyio.fail_after(DEADLINE_S):
            await pool.aclose()
        tg.cancel_scope.cancel()


async def test_a_pool_whose_forkserver_died_closes_promptly(tmp_path) -> None:
    """Its workers are told to shut down as ever, and one that does not answer is killed by pid (its
    handle, which thinks it exited, would kill nothing)."""
    st = Store(tmp_path / "store", durability="none")
    results = []
    async with _orphaned_while_running(st, "01SPINNING", [{"spin": 600_000}], results) as (tg, pool, old):
        await anyio.sleep(1.5)  # the pool has seen the sentinel end and goes on watching the pipe
        with anyio.fail_after(DEADLINE_S):
            await pool.aclose()
        assert [(r.outcome.stop_reason, r.crashed) for r in results] == [("aborted", True)]
        await wait_until(lambda: gone(old), what=f"worker {old} to be killed")
        tg.cancel_scope.cancel()
